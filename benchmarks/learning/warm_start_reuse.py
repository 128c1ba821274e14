"""Does a warm start from a finished run speed a new run up?

    nice -n 10 python benchmarks/learning/warm_start_reuse.py --seeds 0-7 --steps 40 --name wsr

On the fast task (configs/arith-fast.yaml): one ExGRPO source run (seed 1000, `--source-steps`
steps, not evaluated), then per paired seed an ExGRPO run from a cold start and one with
`buffer.warm_start=<source>`, identical otherwise (same seed, data order, model). Held-out pass@1
(all 256 test questions x `eval.samples`) before step 0 and every `--eval-every` steps. After every
seed, results/warm_start_reuse_<name>.json / .md hold the curves and the paired statistics
(warm - cold, `exgrpo_core.evaluation.stats`): final held-out pass@1, area under the held-out curve,
mean fresh training pass@1. Library loop (no Prefect, no MLflow), one torch thread. Rerun to go on:
finished seeds are kept, a half-done seed starts again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402
from benchmarks.learning.arith_compare import parse_seed_range  # noqa: E402

SOURCE_SEED = 1000


def train(preset: str, overrides: list[str], steps: int, eval_every: int) -> dict:
    """One run through the library loop: held-out pass@1 by step (-1 = start), fresh pass@1 per step."""
    from exgrpo_core import loop, metrics as M
    from exgrpo_core.config.load import load_config
    from exgrpo_core.evaluation import evaluate as E
    from exgrpo_core.run.session import open_session
    from flows.eval_tasks import generation_args, load_items

    cfg = load_config(preset, [*overrides, f"run.steps={steps}", "run.checkpoint_every=0", "run.resume=never"])
    items, args = load_items(cfg), generation_args(cfg)
    shutil.rmtree(Path(cfg.run.output_dir) / cfg.run.name, ignore_errors=True)  # a half-done attempt
    s = open_session(cfg)
    out = {"heldout": [], "fresh_pass1": [], "replayed": 0.0, "replay_started_step": None, "seconds": 0.0}
    t0 = time.time()

    def evaluate(step: int) -> None:
        engine = s.team.engine_view(top_p=args["top_p"], batch_size=args["batch_size"])
        report = E.evaluate_items(s.accelerator.unwrap_model(s.model), s.tokenizer, items, s.verify,
                                  **{**args, "engine": engine})
        out["heldout"].append((step, report.average["pass@1"]))

    try:
        out["warm_start"] = json.loads(s.store.get_run(s.run_id)["warm_start_json"] or "null")
        if eval_every:
            evaluate(-1)
        for step in range(steps):
            m = loop.run_iteration(s)
            out["fresh_pass1"].append(m[M.FRESH_PASS1])
            out["replayed"] += m[M.REPLAYED_SAMPLES]
            if eval_every and ((step + 1) % eval_every == 0 or step == steps - 1):
                evaluate(step)
        out["replay_started_step"] = s.replay_started_step
        s.store.update_run(s.run_id, status="finished")
    finally:
        s.close()
    out["seconds"] = time.time() - t0
    return out


def paired(runs: dict, seeds: list[int]) -> dict:
    """warm - cold per seed and their summary, for each metric."""
    from exgrpo_core.evaluation import stats

    def metrics(r: dict) -> dict:
        steps, ys = zip(*r["heldout"])
        return {"final held-out pass@1": ys[-1], "area under the held-out curve": stats.area_under_curve(steps, ys),
                "mean fresh training pass@1": stats.mean(r["fresh_pass1"])}

    out = {}
    for name in ("final held-out pass@1", "area under the held-out curve", "mean fresh training pass@1"):
        cold = {s: metrics(runs[str(s)]["cold"])[name] for s in seeds}
        warm = {s: metrics(runs[str(s)]["warm"])[name] for s in seeds}
        diffs = stats.paired_differences(warm, cold)
        out[name] = {"cold": stats.mean(list(cold.values())), "warm": stats.mean(list(warm.values())),
                     "per_seed": diffs, **stats.summarise_differences(list(diffs.values()))}
    return out


def markdown(result: dict) -> str:
    lines = [f"# Warm start vs cold start on arith-fast ({result['name']})", "",
             f"Seeds {result['seeds_done']}, {result['steps']} steps each, warm start from `{result['source']}` "
             f"({result['source_steps']} ExGRPO steps, seed {SOURCE_SEED}; seeded "
             f"{result['source_pool']['trajectories']} trajectories of {result['source_pool']['questions']} "
             "questions). Paired differences warm - cold, same seed.", "",
             "| metric | cold | warm | mean diff | 95% t-interval | 95% bootstrap | seeds ahead / behind | verdict |",
             "|---|---:|---:|---:|---|---|---|---|"]
    for name, p in result["paired"].items():
        lines.append(f"| {name} | {p['cold']:.3f} | {p['warm']:.3f} | {p['mean']:+.3f} | {p['t_lo']:+.3f} .. "
                     f"{p['t_hi']:+.3f} | {p['boot_lo']:+.3f} .. {p['boot_hi']:+.3f} | {p['ahead']} / "
                     f"{p['behind']} | {p['verdict']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="arith-fast")
    ap.add_argument("--seeds", default="0-7")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--source-steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--name", default="wsr")
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "warm-start-reuse"))
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    stem = f"warm_start_reuse_{a.name}"
    done_file = RESULTS / f"{stem}.json"
    result = json.loads(done_file.read_text()) if done_file.exists() else {}
    runs = result.get("runs", {})
    base = [f"run.output_dir={a.output_dir}"]
    source = f"{a.name}-source"
    if not result.get("source_pool"):
        src = train(a.config, [*base, f"run.name={source}", f"run.seed={SOURCE_SEED}"], a.source_steps, 0)
        print(f"source run done in {src['seconds']:.0f} s", flush=True)
    seeds = parse_seed_range(a.seeds)
    for seed in seeds:
        if str(seed) in runs:
            continue
        t0 = time.time()
        pair = {arm: train(a.config, [*base, f"run.name={a.name}-{arm}-s{seed}", f"run.seed={seed}", *extra],
                           a.steps, a.eval_every)
                for arm, extra in (("cold", []), ("warm", [f"buffer.warm_start={source}"]))}
        runs[str(seed)] = pair
        done = [s for s in seeds if str(s) in runs] + [int(s) for s in runs if int(s) not in seeds]
        result = {"name": a.name, "preset": a.config, "steps": a.steps, "source": source, "source_steps": a.source_steps,
                  "source_pool": pair["warm"]["warm_start"], "seeds_done": done, "seeds_planned": seeds,
                  "runs": runs, "paired": paired(runs, done)}
        save_result(f"{stem}.json", result)
        (RESULTS / f"{stem}.md").write_text(markdown(result))
        print(f"seed {seed} done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
