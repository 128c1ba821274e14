"""Seconds per training step: TRL's GRPOTrainer against our on-policy loop and our ExGRPO loop, side by side.

    bash benchmarks/speed/setup_trl.sh                      # once: TRL into benchmarks/.trl (not a project dependency)
    python benchmarks/speed/trl_speed.py --config tiny --steps 20
    python benchmarks/speed/trl_speed.py --config cpu-demo --steps 6

One process, one `torch.set_num_threads`, three arms built from the same preset and the same initial
weights: TRL (`GRPOTrainer`, generation with `model.generate`), ours with `buffer.replay_ratio=0`
(plain on-policy GRPO) and ours with the preset's ExGRPO settings. The arms are interleaved step by
step: a TRL callback runs one iteration of each of our arms after every TRL optimiser step, so load
from other processes hits all arms alike. Matched: questions and chat template, generations per
prompt, max new tokens, temperature / top-p / top-k, rows per micro-batch and per optimiser step
(one optimiser step per iteration), AdamW with the same lr / weight decay / grad clip, constant lr,
clip eps, entropy coefficient, Dr.GRPO aggregation (sum / max length), no std scaling, no KL, the
same math-verify grader (our `MathVerifier`) as TRL's reward function, float32 on CPU.
Ours runs the library loop (`exgrpo_core.loop`, SQLite store, no Prefect / MLflow: that overhead is
benchmarks/speed/orchestration_overhead.py); TRL runs with `report_to=none`.
Prints medians over the steps after `--warmup`, and writes benchmarks/results/trl_speed_<preset>.json.

FLOPs (benchmarks/speed/flops_meter.py): every arm's CPU seconds per step (one process, one thread count:
other jobs on the machine slow the wall clock, not this), its useful FLOPs per step (each distinct
prompt once and each response token once through sampling and through forward + backward; TRL's
prompt tokens are estimated as B x the mean prompt length of the training set), the floor = useful
FLOPs / this machine's fp32 matmul rate per CPU-second, and the ratio CPU-s / floor. Executed FLOPs
are counted (torch's FlopCounterMode) on the warm-up steps only, which the medians leave out.

glibc's malloc (`run.malloc`, exgrpo_core/run/allocator.py) is process-wide: each of our arms runs under
its own session's setting, TRL's steps under `--trl-malloc` (default `system`, glibc's defaults: TRL
as users run it). `onpolicy-system` is our on-policy arm under glibc's defaults.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / ".trl"))  # TRL lives here, installed by setup_trl.sh
sys.path.insert(0, str(ROOT))

STAGES = ["rollout", "score", "verify", "buffer", "select", "train", "log"]


def timed_iteration(s, loop, M, count: bool = False) -> dict:
    """`loop.run_iteration` with every stage timed, planning counted in `select` and the
    trainer's scoring pass (inside `generate`) split out as `score`; its CPU seconds, useful FLOPs and
    (`count`) executed FLOPs."""
    from benchmarks.speed.flops_meter import Counted, step_useful_flops

    with Counted(count) as counted:
        row = _timed_iteration(s, loop, M)
    row["executed_gflop"] = counted.flops / 1e9 if counted.flops is not None else None
    row["useful_gflop"] = step_useful_flops(s.accelerator.unwrap_model(s.model), row.pop("prompt_tokens"),
                                            int(row["tokens"]), int(row["tokens"] + row.pop("replayed_tokens"))) / 1e9
    return row


def _timed_iteration(s, loop, M) -> dict:
    c0, t0 = time.process_time(), time.perf_counter()
    plan = loop.plan_batch(s)
    t_plan = time.perf_counter() - t0
    rollouts, st1 = loop.generate(s, plan)
    st2 = loop.verify(s, rollouts)
    groups, st3 = loop.update_buffer(s, plan, rollouts)
    replayed, st4 = loop.select_trajectories(s, plan)
    st5 = loop.train(s, groups, replayed)
    t1 = time.perf_counter()
    out = {**st1, **st2, **st3, **st4, **st5, **loop.buffer_snapshot(s)}
    s.store.log_metrics(s.run_id, plan.step, out)
    s.store.update_run(s.run_id, step=plan.step)
    s.step += 1
    t_end = time.perf_counter()
    score = SCORE_TIME.pop(id(s), 0.0)
    return {"iteration": t_end - t0, "cpu": time.process_time() - c0,
            "prompt_tokens": sum(len(s.prompt_ids(u)) for u in plan.fresh + plan.replay),
            "replayed_tokens": sum(len(r.response_ids) for r in replayed.values()), "rollout": st1[M.TIME_ROLLOUT] - score, "score": score,
            "verify": st2[M.TIME_VERIFY], "buffer": st3[M.TIME_BUFFER], "select": st4[M.TIME_SELECT] + t_plan,
            "train": st5[M.TIME_TRAIN], "log": t_end - t1,
            "tokens": st1[M.RESPONSE_LENGTH] * st1[M.RESPONSES], "reward": st2[M.REWARD_MEAN],
            "replayed": st4[M.REPLAYED_SAMPLES]}


SCORE_TIME: dict[int, float] = {}


def _instrument_scoring(loop) -> None:
    """Time the trainer's scoring pass of fresh rollouts (part of `rollout/`, split out for the profile)."""
    original = loop.score_rollouts

    def timed(s, rollouts, *a, **kw):
        t0 = time.perf_counter()
        original(s, rollouts, *a, **kw)
        if not a and not kw:  # generate()'s call; select_trajectories passes the entropy kind
            SCORE_TIME[id(s)] = SCORE_TIME.get(id(s), 0.0) + time.perf_counter() - t0

    loop.score_rollouts = timed


def trl_config(cfg, out_dir: str, max_steps: int):
    """GRPOConfig matching our config field by field (see the module docstring)."""
    from trl import GRPOConfig

    K, rows = cfg.rollout.group_size, cfg.train.mini_batch_size * cfg.rollout.group_size
    micro = min(cfg.train.micro_batch_size, rows)
    if rows % micro or cfg.train.batch_size != cfg.train.mini_batch_size:
        raise SystemExit("trl_speed needs one optimiser step per iteration and micro | rows")
    return GRPOConfig(
        output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro, num_generations=K, num_iterations=1,
        max_completion_length=cfg.rollout.max_response_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, top_k=0, learning_rate=cfg.train.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=cfg.train.weight_decay, max_grad_norm=cfg.train.max_grad_norm,
        beta=cfg.loss.kl_coef, epsilon=cfg.loss.clip_eps, loss_type="dr_grpo", scale_rewards="none",
        entropy_coef=cfg.loss.entropy_coef, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=cfg.model.gradient_checkpointing is True, logging_steps=1, report_to="none",
        save_strategy="no", seed=cfg.run.seed, dataloader_num_workers=0, disable_tqdm=True,
        log_completions=False)


def build_trl(cfg, questions, verifier, callback, out_dir: str, max_steps: int):
    from datasets import Dataset
    from trl import GRPOTrainer

    from exgrpo_core.models.load import load_policy

    model, tok = load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype, tiny=cfg.model.tiny.model_dump(),
                             seed=cfg.run.seed)
    ds = Dataset.from_list([{"prompt": list(q.messages), "answer": q.answer} for q in questions])
    tokens: list[int] = []

    def math_verify_reward(completions, answer, completion_ids, **_):
        """Same grader as ours: last boxed / number, math-verify, per-item timeout."""
        tokens.append(sum(len(c) for c in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(r) for r, _ in verifier.verify(texts, list(answer))]

    trainer = GRPOTrainer(model=model, reward_funcs=math_verify_reward, args=trl_config(cfg, out_dir, max_steps),
                          train_dataset=ds, processing_class=tok, callbacks=[callback])
    return trainer, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per arm (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps dropped from the medians")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for all arms")
    ap.add_argument("--arms", default="trl,onpolicy,exgrpo",
                    help="of trl, onpolicy, exgrpo, onpolicy-generate (on-policy with rollout.decoder=generate), "
                         "onpolicy-s1 / -s2 (rollout.decode_streams=1 / 2), onpolicy-torch (rollout.decode_matmul=torch), "
                         "onpolicy-system (run.malloc=system)")
    ap.add_argument("--trl-malloc", choices=["system", "reuse"], default="system",
                    help="glibc malloc setting for TRL's steps (exgrpo_core/run/allocator.py)")
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. before / after)")
    ap.add_argument("--set", action="append", default=[], help="config overrides for every arm")
    args = ap.parse_args()
    import torch
    from transformers import TrainerCallback

    from benchmarks.bench_record import save_result
    from exgrpo_core import loop, metrics as M
    from exgrpo_core.config.load import load_config
    from exgrpo_core.data import questions as data
    from exgrpo_core.reward.grading import MathVerifier
    from exgrpo_core.run import allocator
    from exgrpo_core.run.session import open_session

    from benchmarks.speed.flops_meter import Counted, matmul_rate, step_useful_flops

    if args.threads:
        torch.set_num_threads(args.threads)
    rate, wall_rate = matmul_rate(torch.get_num_threads()), matmul_rate(torch.get_num_threads(), wall=True)
    uptime = [os.popen("uptime").read().strip()]
    arms = args.arms.split(",")
    total = args.warmup + args.steps
    out = tempfile.mkdtemp(prefix="exgrpo-trl-speed-")
    base = [f"run.output_dir={out}", f"run.steps={total + 1}", "run.checkpoint_every=0", "run.resume=never",
            *args.set]
    cfg = load_config(args.config, base)
    _instrument_scoring(loop)
    ours = {}
    if "onpolicy" in arms:
        ours["onpolicy"] = open_session(load_config(args.config, base + ["run.name=onpolicy", "buffer.replay_ratio=0"]))
    if "onpolicy-generate" in arms:  # the code before rollout/decode.py, interleaved with the rest
        ours["onpolicy-generate"] = open_session(load_config(args.config, base + [
            "run.name=onpolicy-generate", "buffer.replay_ratio=0", "rollout.decoder=generate"]))
    if "onpolicy-s1" in arms:  # sampling in one part (rollout.decode_streams=1; the default is 2 at 2 threads)
        ours["onpolicy-s1"] = open_session(load_config(args.config, base + [
            "run.name=onpolicy-s1", "buffer.replay_ratio=0", "rollout.decode_streams=1"]))
    if "onpolicy-s2" in arms:  # sampling in two concurrent parts (rollout.decode_streams=2): run with --threads 2
        ours["onpolicy-s2"] = open_session(load_config(args.config, base + [
            "run.name=onpolicy-s2", "buffer.replay_ratio=0", "rollout.decode_streams=2"]))
    if "onpolicy-torch" in arms:  # decode products by torch, not on packed oneDNN weights (rollout.decode_matmul)
        ours["onpolicy-torch"] = open_session(load_config(args.config, base + [
            "run.name=onpolicy-torch", "buffer.replay_ratio=0", "rollout.decode_matmul=torch"]))
    if "onpolicy-system" in arms:  # glibc's malloc defaults (run.malloc=system)
        ours["onpolicy-system"] = open_session(load_config(args.config, base + [
            "run.name=onpolicy-system", "buffer.replay_ratio=0", "run.malloc=system"]))
    if "exgrpo" in arms:
        ours["exgrpo"] = open_session(load_config(args.config, base + ["run.name=exgrpo"]))
    times: dict[str, list[dict]] = {a: [] for a in arms}
    mark = [0.0, 0.0]
    counter = [Counted(False)]

    def run_ours():
        for name, s in ours.items():
            allocator.use(s.cfg.run.malloc)
            times[name].append(timed_iteration(s, loop, M, count=len(times[name]) < args.warmup))
        allocator.use(args.trl_malloc)

    class Interleave(TrainerCallback):
        def on_train_begin(self, *a, **k):
            mark[:] = [time.perf_counter(), time.process_time()]

        def on_step_begin(self, *a, **k):
            counter[0] = Counted(len(times["trl"]) < args.warmup).__enter__()

        def on_step_end(self, *a, **k):
            counter[0].__exit__(None, None, None)
            wall, cpu = time.perf_counter() - mark[0], time.process_time() - mark[1]
            tokens = trl_tokens.pop(0)
            flops = counter[0].flops
            times["trl"].append({"iteration": wall, "cpu": cpu, "tokens": tokens,
                                 "executed_gflop": flops / 1e9 if flops is not None else None,
                                 "useful_gflop": step_useful_flops(trainer.model, trl_prompt_tokens, tokens, tokens) / 1e9})
            run_ours()
            mark[:] = [time.perf_counter(), time.process_time()]

    if "trl" in arms:
        questions = data.load_questions(cfg.data.train_path, question_key=cfg.data.question_key,
                                        answer_key=cfg.data.answer_key, system_prompt=cfg.data.system_prompt,
                                        instruction=cfg.data.instruction, max_questions=cfg.data.max_questions)
        verifier = MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers)
        trainer, trl_tokens = build_trl(cfg, questions, verifier, Interleave(), out + "/trl", total)
        sample = questions[:256]
        trl_prompt_tokens = round(cfg.train.batch_size * sum(
            len(data.prompt_token_ids(trainer.processing_class, q, cfg.rollout.max_prompt_tokens)) for q in sample) / len(sample))
        allocator.use(args.trl_malloc)  # TRL's first step; later ones follow run_ours()
        trainer.train()
        verifier.close()
    else:
        for _ in range(total):
            run_ours()
    for s in ours.values():
        s.close()

    load = os.getloadavg()
    uptime.append(os.popen("uptime").read().strip())
    result = {"preset": args.config, "overrides": args.set, "steps": args.steps, "warmup": args.warmup, "trl_malloc": args.trl_malloc,
              "threads": torch.get_num_threads(), "loadavg_1_5_15": load, "uptime": uptime,
              "matmul_gflop_per_cpu_s": rate / 1e9, "matmul_gflop_per_wall_s": wall_rate / 1e9, "arms": {}}
    print(f"\n{args.config}: median over steps {args.warmup}..{total - 1}, {torch.get_num_threads()} threads, "
          f"load {load[0]:.2f}")
    print(f"{'arm':<10} {'s/step':>8} {'ms/token':>9} {'tokens':>7}  " + " ".join(f"{s:>8}" for s in STAGES))
    for arm, rows in times.items():
        kept = rows[args.warmup:]
        med = {k: statistics.median(r[k] for r in kept) for k in kept[0] if k != "executed_gflop"} if kept else {}
        counted = [r for r in rows[:args.warmup] if r.get("executed_gflop")]
        if counted:  # executed / useful on the counted warm-up steps
            med["executed_over_useful"] = statistics.median(r["executed_gflop"] / r["useful_gflop"] for r in counted)
        med["floor_cpu_s"] = med["useful_gflop"] * 1e9 / rate
        med["cpu_over_floor"] = med["cpu"] / med["floor_cpu_s"]
        med["floor_wall_s"] = med["useful_gflop"] * 1e9 / wall_rate  # what all threads together could do
        med["wall_over_floor"] = med["iteration"] / med["floor_wall_s"]
        med["ms_per_token"] = statistics.median(1e3 * r["iteration"] / max(r["tokens"], 1) for r in kept)
        result["arms"][arm] = {"median": med, "per_step_seconds": [r["iteration"] for r in rows]}
        split = " ".join(f"{med.get(s, float('nan')):>8.3f}" for s in STAGES)
        print(f"{arm:<10} {med['iteration']:>8.3f} {med['ms_per_token']:>9.2f} {med['tokens']:>7.0f}  {split}")
        print(f"{'':<10} cpu {med['cpu']:.2f} s, useful {med['useful_gflop']:.0f} GFLOP, floor {med['floor_cpu_s']:.2f} "
              f"cpu-s, cpu/floor {med['cpu_over_floor']:.2f}, wall/floor {med['wall_over_floor']:.2f}, executed/useful (warm-up) "
              f"{med.get('executed_over_useful', float('nan')):.2f}")
    w = args.warmup
    for arm in [a for a in times if a != "trl" and "trl" in times]:
        pairs = list(zip(times["trl"][w:], times[arm][w:]))
        key = arm.replace("-", "_")
        result[f"{key}_over_trl_median_ratio"] = statistics.median(o["iteration"] / t["iteration"] for t, o in pairs)
        result[f"{key}_over_trl_cpu_ratio"] = statistics.median(o["cpu"] / t["cpu"] for t, o in pairs)
        result[f"{key}_over_trl_cpu_per_token_ratio"] = statistics.median(
            (o["cpu"] / max(o["tokens"], 1)) / (t["cpu"] / max(t["tokens"], 1)) for t, o in pairs)
        print(f"{arm} / TRL, median of per-step ratios: wall {result[f'{key}_over_trl_median_ratio']:.3f}, "
              f"CPU-s {result[f'{key}_over_trl_cpu_ratio']:.3f}, CPU-s per generated token "
              f"{result[f'{key}_over_trl_cpu_per_token_ratio']:.3f}")
    base_arm = "onpolicy-s1" if "onpolicy-s1" in times else "onpolicy"
    if base_arm in times and "onpolicy-s2" in times:  # two decode streams against one, step by step
        pairs = list(zip(times[base_arm][w:], times["onpolicy-s2"][w:]))
        tag = f"onpolicy_s2_over_{base_arm.replace('-', '_')}"
        for k in ("iteration", "cpu", *[s for s in STAGES if s in pairs[0][0]]):
            ratios = [b[k] / a[k] for a, b in pairs if a[k]]
            if ratios:
                result[f"{tag}_{k}_ratio"] = statistics.median(ratios)
        per_token = [(b["rollout"] / max(b["tokens"], 1)) / (a["rollout"] / max(a["tokens"], 1)) for a, b in pairs
                     if a.get("rollout")]
        if per_token:  # the arms sample different answers: compare sampling per generated token
            result[f"{tag}_rollout_per_token_ratio"] = statistics.median(per_token)
        print(f"onpolicy-s2 / {base_arm}, median of per-step ratios: " + ", ".join(
            f"{k.removeprefix(tag + '_')} {v:.3f}" for k, v in result.items() if k.startswith(tag)))
    name = f"trl_speed_{args.config}{'_' + args.tag if args.tag else ''}.json"
    save_result(name, result)


if __name__ == "__main__":
    main()
