"""The train phase (forward + backward + optimiser over a step's rows) of real batches: old code against new.

    python benchmarks/speed/train_speed.py --config cpu-demo --batches 2 --rounds 3 --threads 1 --tag after

Batches are sampled once with the preset's session (rollouts, grading, advantages, shuffled and
collated as `loop.train` does). Arms, each with its own copy of the initial weights and its own AdamW:
`base` = exgrpo_core/training/{optimise,policy,forward_parts,batch}.py at `--base` (read with
`git show` into a private package, the rest of the library shared), `git:<commit>` = the same at
another commit, `new` = this tree, `noshare` = this tree with `share_prompts=False`. Rounds alternate the arms' order; every round runs each batch
through each arm (one optimiser step per batch, as cpu-demo does), timed in CPU and wall seconds.
Round 0 is a warm-up that also counts executed FLOPs (torch's FlopCounterMode) and checks the arms'
losses against each other (same weights then). Useful FLOPs (benchmarks/speed/flops_meter.py): 6 x (body x
each distinct prompt's tokens + (body + head) x each response token); floor = useful / this
machine's fp32 matmul rate per CPU-second. Writes results/train_speed_<preset>_<tag>.json.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PARTS = ("batch", "forward_parts", "policy", "optimise")


def base_optimise(commit: str):
    """`optimise` as it was at `commit`: the four training modules loaded as a private package."""
    name_pkg = f"train_{commit}"
    pkg = types.ModuleType(name_pkg)
    pkg.__path__ = []
    sys.modules[name_pkg] = pkg
    for name in PARTS:
        src = subprocess.run(["git", "show", f"{commit}:exgrpo_core/training/{name}.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        src = src.replace("from exgrpo_core.training import distributed as D, policy",
                          f"from exgrpo_core.training import distributed as D\nfrom {name_pkg} import policy")
        src = re.sub(r"exgrpo_core\.training\.(" + "|".join(PARTS) + r")\b", name_pkg + r".\1", src)
        mod = types.ModuleType(f"{name_pkg}.{name}")
        mod.__file__ = f"<{commit[:7]}:{name}.py>"
        sys.modules[mod.__name__] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        setattr(pkg, name, mod)
    return pkg.optimise.optimise


def sample_batches(s, n: int):
    """n collated batches with their optimise() keyword arguments, as loop.train builds them."""
    from exgrpo_core import loop
    from exgrpo_core.algorithm import losses
    from exgrpo_core.training.batch import collate

    cfg, out = s.cfg, []
    for _ in range(n):
        plan = loop.plan_batch(s)
        rollouts, _ = loop.generate(s, plan)
        loop.verify(s, rollouts)
        groups, _ = loop.update_buffer(s, plan, rollouts)
        replayed, _ = loop.select_trajectories(s, plan)
        rows, advs, qidx, _ = loop.shuffled_rows(groups, replayed, cfg.loss.std_normalize, s.rng)
        batch = collate(rows, advs, s.engine.pad_id, qidx, tis_cap=cfg.loss.tis_cap)
        kw = dict(n_minibatches=cfg.train.batch_size // cfg.train.mini_batch_size,
                  micro_batch_size=cfg.train.micro_batch_size, micro_batch_tokens=cfg.train.micro_batch_tokens,
                  onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=cfg.loss.clip_eps),
                  replay_term=partial(losses.shaped_replay_term, beta=cfg.loss.shaping_beta),
                  aggregation=cfg.loss.aggregation, max_response_len=cfg.rollout.max_response_tokens,
                  entropy_coef=cfg.loss.entropy_coef, kl_coef=0.0, ref_model=None,
                  temperature=cfg.rollout.temperature, max_grad_norm=cfg.train.max_grad_norm,
                  skip_grad_norm=cfg.train.skip_grad_norm)
        prompts = {tuple(r.prompt_ids) for r in rows}
        out.append((batch, kw, {"rows": len(rows), "replayed_rows": int(batch.is_replay.sum()),
                                "distinct_prompt_tokens": sum(len(p) for p in prompts),
                                "response_tokens": int(batch.response_mask.sum()),
                                "padded_tokens": int(batch.attention_mask.numel())}))
        s.step += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-demo")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arms", default="base,new")
    ap.add_argument("--base", default="21c995b", help="commit of the old training code")
    ap.add_argument("--tag", default="")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()

    import torch

    from benchmarks.bench_record import save_result
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import adamw, open_session
    from exgrpo_core.training.optimise import optimise
    from benchmarks.speed.flops_meter import Counted, head_and_body, matmul_rate

    torch.set_num_threads(args.threads)
    uptime = [os.popen("uptime").read().strip()]
    rate = matmul_rate(args.threads)
    out = tempfile.mkdtemp(prefix="exgrpo-train-speed-")
    cfg = load_config(args.config, [f"run.output_dir={out}", "run.checkpoint_every=0", "run.resume=never", *args.set])
    s = open_session(cfg)
    batches = sample_batches(s, args.batches)
    model0 = s.accelerator.unwrap_model(s.model)
    head, body = head_and_body(model0)
    fns = {"new": optimise, "noshare": partial(optimise, share_prompts=False)}
    arms = {}
    for name in args.arms.split(","):
        fn = fns.get(name) or base_optimise(args.base if name == "base" else name.removeprefix("git:"))
        m = copy.deepcopy(model0)
        arms[name] = (m, adamw(m.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay), fn)
    s.close()
    times = {a: {"cpu": [], "wall": []} for a in arms}
    executed, losses0 = {}, {}
    for rnd in range(args.rounds + 1):
        order = list(arms) if rnd % 2 == 0 else list(reversed(arms))
        for b, (batch, kw, _) in enumerate(batches):
            for a in order:
                model, opt, fn = arms[a]
                c0, t0 = time.process_time(), time.perf_counter()
                with Counted(rnd == 0) as counted:
                    stats = fn(model, opt, s.accelerator, copy.deepcopy(batch), **kw)
                cpu, wall = time.process_time() - c0, time.perf_counter() - t0
                if rnd == 0:
                    executed.setdefault(a, []).append(counted.flops / 1e9)
                    losses0.setdefault(a, []).append(stats["loss/total"])
                else:
                    times[a]["cpu"].append(cpu)
                    times[a]["wall"].append(wall)
                print(f"round {rnd} batch {b} {a:>8}: {cpu:6.2f} CPU-s {wall:6.2f} s loss {stats['loss/total']:+.6f}",
                      flush=True)
    uptime.append(os.popen("uptime").read().strip())
    useful = [6 * (body * info["distinct_prompt_tokens"] + (body + head) * info["response_tokens"]) / 1e9
              for _, _, info in batches]
    floor = sum(useful) / (rate / 1e9)  # CPU-s for one pass over all batches
    result = {"preset": args.config, "threads": args.threads, "base": args.base, "rounds": args.rounds,
              "batches": [info for _, _, info in batches], "matmul_gflop_per_cpu_s": rate / 1e9,
              "useful_gflop_per_batch": useful, "floor_cpu_s_per_batch": floor / len(batches), "arms": {},
              "uptime": uptime, "round0_loss_total": losses0}
    n = len(batches)
    for a, t in times.items():
        per_round = [sum(t["cpu"][i:i + n]) / n for i in range(0, len(t["cpu"]), n)]
        per_wall = [sum(t["wall"][i:i + n]) / n for i in range(0, len(t["wall"]), n)]
        result["arms"][a] = {"cpu_s_per_batch_median": statistics.median(per_round), "cpu_s_per_batch_rounds": per_round,
                             "wall_s_per_batch_median": statistics.median(per_wall),
                             "executed_gflop_per_batch": executed[a],
                             "executed_over_useful": sum(executed[a]) / sum(useful),
                             "cpu_s_over_floor": statistics.median(per_round) / (floor / n)}
    if "base" in times:
        for a in times:
            ratios = [x / y for x, y in zip(times[a]["cpu"], times["base"]["cpu"])]
            result["arms"][a]["cpu_ratio_to_base_median"] = statistics.median(ratios)
    for a, r in result["arms"].items():
        print(f"{a:>8}: {r['cpu_s_per_batch_median']:.2f} CPU-s per batch, executed/useful "
              f"{r['executed_over_useful']:.2f}, over floor {r['cpu_s_over_floor']:.2f}, "
              f"ratio to base {r.get('cpu_ratio_to_base_median', float('nan')):.3f}")
    print(*uptime, sep="\n")
    save_result(f"train_speed_{args.config}{'_' + args.tag if args.tag else ''}.json", result)


if __name__ == "__main__":
    main()
