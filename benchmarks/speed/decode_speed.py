"""Sampling speed of the transformers engine's decoders, interleaved in one process, against the floor.

    python benchmarks/speed/decode_speed.py --config cpu-demo --rounds 3 --threads 1

One cpu-demo rollout batch (B questions of the preset's training set x K samples, the preset's
temperature and response length) is sampled by each mode in turn, round after round, with the same
seed: `generate` (transformers' loop, the code before), `own-keep` (our loop with finished rows kept
and the cache concatenated), `own-drop` (finished rows dropped), `own-noprefix` (dropped + the cache written in
place), `own` (and the prompts' common prefix prefilled once: the default), `own-s2` (in two concurrent parts,
`rollout.decode_streams=2`: run it with `--threads 2`); `-torch` modes multiply with torch's product instead of
packed oneDNN weights (`rollout.decode_matmul=torch`; own-keep / own-drop / own-noprefix use it too, as
when they were measured). The own modes must give identical tokens (checked, except across matmul kinds,
whose float rounding may flip a token: the share of identical rows is printed). Reported per mode: median wall
and CPU seconds, ratio to `generate` per round, row-steps executed vs useful (tokens up to each row's
end), model FLOPs executed vs useful, and the floor = useful FLOPs / this machine's measured fp32
matmul rate per CPU-second (`flops_meter.matmul_rate`), compared with the CPU seconds spent (on a
shared machine wall time also counts waiting for a core). `uptime` is recorded before and after.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_T = dict(matmul="torch")
MODES = {"generate": dict(decoder="generate"),
         "own-keep": dict(decoder="own", drop_finished=False, static_cache=False, streams=1, **_T),
         "own-drop": dict(decoder="own", drop_finished=True, static_cache=False, streams=1, **_T),
         "own-noprefix": dict(decoder="own", drop_finished=True, static_cache=True, min_prefix=10 ** 9, streams=1, **_T),
         "own-torch": dict(decoder="own", drop_finished=True, static_cache=True, min_prefix=2, streams=1, **_T),
         "own": dict(decoder="own", drop_finished=True, static_cache=True, min_prefix=2, streams=1, matmul="auto"),
         "own-s2-torch": dict(decoder="own", drop_finished=True, static_cache=True, min_prefix=2, streams=2, **_T),
         "own-s2": dict(decoder="own", drop_finished=True, static_cache=True, min_prefix=2, streams=2, matmul="auto")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-demo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--questions", type=int, default=None, help="default: train.batch_size")
    ap.add_argument("--tag", default="")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()

    import torch

    from exgrpo_core.config.load import load_config
    from exgrpo_core.data import questions as data
    from exgrpo_core.models import load as models
    from exgrpo_core.rollout.engine import TransformersEngine
    from benchmarks.speed.flops_meter import decode_flops, matmul_rate

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    model, tok = models.load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype, tiny=cfg.model.tiny.model_dump())
    qs = data.load_questions(cfg.data.train_path,
                             system_prompt=cfg.data.system_prompt, instruction=cfg.data.instruction,
                             prompt_template=cfg.data.prompt_template)
    b = args.questions or cfg.train.batch_size
    prompts = [data.prompt_token_ids(tok, q, cfg.rollout.max_prompt_tokens) for q in qs[:b]]
    K, T, temp = cfg.rollout.group_size, cfg.rollout.max_response_tokens, cfg.rollout.temperature
    engine = TransformersEngine(model, tok, top_p=cfg.rollout.top_p, batch_size=cfg.rollout.generation_batch_size)
    modes = args.modes.split(",")
    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    rate, wall_rate = matmul_rate(torch.get_num_threads()), matmul_rate(torch.get_num_threads(), wall=True)
    print(f"matmul {rate / 1e9:.1f} GFLOP per CPU-second, {wall_rate / 1e9:.1f} per wall second "
          f"on {torch.get_num_threads()} thread(s)")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        ref: dict[str, list] = {}
        for m in modes:
            for k, v in MODES[m].items():
                setattr(engine, k, v)
            engine.row_steps = 0
            torch.manual_seed(1000 + r)
            c0, t0 = time.process_time(), time.perf_counter()
            gens = engine.generate(prompts, K, temperature=temp, max_new_tokens=T)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            flat = [g for grp in gens for g in grp]
            lens = [len(g.response_ids) for g in flat]
            same = None
            if m.startswith("own"):
                ids, kind = [g.response_ids for g in flat], MODES[m]["matmul"]
                assert ref.get(kind) in (None, ids), f"{m} sampled other tokens than the other own {kind} modes"
                ref[kind] = ids
                other = ref.get("torch" if kind == "auto" else "auto")
                same = None if other is None else sum(a == b for a, b in zip(ids, other)) / len(ids)
            executed, useful = decode_flops(model, prompts, K, lens, engine.row_steps)
            rows[m].append(dict(wall_s=wall, cpu_s=cpu, row_steps=engine.row_steps, useful_row_steps=sum(lens),
                                same_rows_as_other_matmul=same,
                                tokens=sum(lens), executed_gflop=executed / 1e9, useful_gflop=useful / 1e9,
                                floor_cpu_s=useful / rate, floor_wall_s=useful / wall_rate))
            print(f"round {r} {m:9s} wall {wall:6.2f}s cpu {cpu:6.2f}s row-steps {engine.row_steps:5d} "
                  f"useful {sum(lens):5d} executed {executed / 1e9:6.1f} useful {useful / 1e9:6.1f} GFLOP"
                  + ("" if same is None else f" same rows as the other matmul {same:.2f}"), flush=True)
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    summary = {}
    for m in modes:
        med = lambda k: statistics.median(x[k] for x in rows[m])  # noqa: E731
        ratio = statistics.median(a["wall_s"] / b["wall_s"] for a, b in zip(rows[m], rows[modes[0]]))
        summary[m] = dict(wall_s=med("wall_s"), cpu_s=med("cpu_s"), ratio_to_first=ratio,
                          executed_gflop=med("executed_gflop"), useful_gflop=med("useful_gflop"),
                          floor_cpu_s=med("floor_cpu_s"), cpu_over_floor=med("cpu_s") / med("floor_cpu_s"),
                          floor_wall_s=med("floor_wall_s"), wall_over_floor=med("wall_s") / med("floor_wall_s"))
        print(f"{m:9s} wall {summary[m]['wall_s']:6.2f}s (x{ratio:.2f} of {modes[0]}) cpu {summary[m]['cpu_s']:6.2f}s "
              f"executed/useful {summary[m]['executed_gflop']:.1f}/{summary[m]['useful_gflop']:.1f} GFLOP "
              f"floor {summary[m]['floor_cpu_s']:.2f} cpu-s, cpu/floor {summary[m]['cpu_over_floor']:.2f}, "
              f"wall/floor {summary[m]['wall_over_floor']:.2f}")
    from benchmarks.bench_record import RESULTS, write_json

    out = RESULTS / f"decode_speed_{args.config}{'_' + args.tag if args.tag else ''}.json"
    write_json(out, dict(
        command="python " + " ".join(sys.argv), date=datetime.datetime.now().isoformat(timespec="seconds"),
        threads=torch.get_num_threads(), matmul_gflops=rate / 1e9, matmul_wall_gflops=wall_rate / 1e9, uptime=uptime, shape=dict(questions=b, K=K, tokens=T),
        summary=summary, rounds=rows), indent=1)
    print("wrote", out, "|", *uptime, sep="\n")


if __name__ == "__main__":
    main()
