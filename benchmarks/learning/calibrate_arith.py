"""Calibrate the arith-fast preset: where RL starts and how fast an iteration is.

Builds (or reads from the cache) the warm-started `tiny-sft` model of the preset, samples K responses
per RL training question at the rollout settings (one transformers engine, B questions x K per call
as in training) and per held-out question, grades them with the real MathVerifier, and reports:
step-0 training pass@1, the share of questions in buckets k = 1..K-1 (the replayable ones), the
bucket histogram, distinct correct trajectories per question, held-out pass@1, and the median
seconds per library iteration (`loop.run_iteration`, no Prefect / MLflow) over a few steps on one
thread. Writes benchmarks/results/calibrate_<name>.json.

    python benchmarks/learning/calibrate_arith.py                                  # the preset as committed
    python benchmarks/learning/calibrate_arith.py --set model.warm_start.steps=200 --name try200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import save_result  # noqa: E402


def sample_groups(model, tok, questions, cfg, verify, K: int, seed: int) -> list[dict]:
    from exgrpo_core.data.questions import prompt_token_ids
    from exgrpo_core.rollout.engine import TransformersEngine

    engine = TransformersEngine(model, tok, top_p=cfg.rollout.top_p, batch_size=cfg.rollout.generation_batch_size)
    out, B = [], max(1, cfg.rollout.generation_batch_size // K)
    torch.manual_seed(seed)
    for i in range(0, len(questions), B):
        chunk = questions[i:i + B]
        gens = engine.generate([prompt_token_ids(tok, q, cfg.rollout.max_prompt_tokens) for q in chunk], K,
                               temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_response_tokens)
        grades = verify([g.text for gs in gens for g in gs], [q.answer for q in chunk for _ in range(K)])
        for j, q in enumerate(chunk):
            r = [g[0] for g in grades[j * K:(j + 1) * K]]
            out.append({"uid": q.uid, "k": int(sum(x > 0 for x in r)),
                        "distinct_correct": len({g.text for g, x in zip(gens[j], r) if x > 0}),
                        "truncated": sum(g.truncated for g in gens[j]), "example": gens[j][0].text})
    return out


def summarise(groups: list[dict], K: int) -> dict:
    ks = Counter(g["k"] for g in groups)
    n = len(groups)
    solved = [g["distinct_correct"] for g in groups if g["k"] > 0]
    return {"questions": n, "pass@1": sum(g["k"] for g in groups) / (n * K),
            "share_buckets_1_to_K-1": sum(v for k, v in ks.items() if 0 < k < K) / n,
            "share_k0": ks.get(0, 0) / n, "share_kK": ks.get(K, 0) / n,
            "bucket_histogram": {str(k): ks.get(k, 0) for k in range(K + 1)},
            "mean_distinct_correct_when_any": statistics.fmean(solved) if solved else 0.0,
            "share_with_2plus_distinct_correct": sum(1 for s in solved if s >= 2) / n,
            "truncation_rate": sum(g["truncated"] for g in groups) / (n * K),
            "examples": [g["example"] for g in groups[:6]]}


def iteration_seconds(preset: str, overrides: list[str], steps: int) -> list[float]:
    from exgrpo_core import loop
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(preset, [*overrides, f"run.output_dir={tmp}", "run.name=calib", f"run.steps={steps}",
                                   "run.checkpoint_every=0", "eval.every=0"])
        s = open_session(cfg)
        times = []
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                loop.run_iteration(s)
                times.append(time.perf_counter() - t0)
        finally:
            s.close()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="arith-fast")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--train-questions", type=int, default=256, help="first N RL training questions")
    ap.add_argument("--timing-steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="arith_fast")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from exgrpo_core.config.load import load_config
    from exgrpo_core.data.questions import load_questions
    from exgrpo_core.models.load import load_policy
    from exgrpo_core.models.warm_start import cache_dir
    from exgrpo_core.reward.grading import MathVerifier

    cfg = load_config(a.config, a.set)
    K = cfg.rollout.group_size
    t0 = time.perf_counter()
    model, tok = load_policy(cfg.model.name_or_path, tiny=cfg.model.tiny.model_dump(),
                             warm_start=cfg.model.warm_start.model_dump())
    build_s = time.perf_counter() - t0
    d = cfg.data
    train = load_questions(d.train_path, instruction=d.instruction, max_questions=a.train_questions)
    test = load_questions(d.eval_path, instruction=d.instruction)
    with MathVerifier(cfg.reward.timeout_s) as v:
        t1 = time.perf_counter()
        tr = summarise(sample_groups(model, tok, train, cfg, v.verify, K, a.seed), K)
        sample_s = time.perf_counter() - t1
        te = summarise(sample_groups(model, tok, test, cfg, v.verify, K, a.seed + 1), K)
    times = iteration_seconds(a.config, a.set, a.timing_steps) if a.timing_steps else []
    ok = 0.20 <= tr["pass@1"] <= 0.40 and tr["share_buckets_1_to_K-1"] >= 0.40
    print(f"train pass@1 {tr['pass@1']:.3f}, buckets 1..K-1 {tr['share_buckets_1_to_K-1']:.2f}, "
          f"k=0 {tr['share_k0']:.2f}, k=K {tr['share_kK']:.2f}, histogram {tr['bucket_histogram']}")
    print(f"held-out pass@1 {te['pass@1']:.3f}; distinct correct per solved question {tr['mean_distinct_correct_when_any']:.2f}")
    print(f"model ready in {build_s:.1f} s; sampling {len(train)}x{K} in {sample_s:.1f} s; "
          f"iteration median {statistics.median(times) if times else float('nan'):.3f} s; target met: {ok}")
    save_result(f"calibrate_{a.name}.json", {
        "config": a.config, "overrides": a.set, "group_size": K, "temperature": cfg.rollout.temperature,
        "warm_start": cfg.model.warm_start.model_dump(), "tiny": cfg.model.tiny.model_dump(),
        "model_cache": str(cache_dir(cfg.model.tiny.model_dump(), cfg.model.warm_start.model_dump())),
        "model_ready_s": build_s, "train": tr, "heldout": te, "iteration_s": times,
        "iteration_s_median": statistics.median(times) if times else None, "threads": 1,
        "targets": "train pass@1 in [0.20, 0.40] and >= 40% of questions in buckets 1..K-1", "targets_met": ok})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
