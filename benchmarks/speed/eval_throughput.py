"""Evaluation throughput (questions/s, samples/s, generated tokens/s) of `evaluation.evaluate_items`.

    python benchmarks/speed/eval_throughput.py --config cpu-demo --suite bundled:arith-easy-test --max-questions 32
    python benchmarks/speed/eval_throughput.py --config cpu-demo --suite gsm8k --max-questions 16 --set eval.max_response_tokens=256
    python benchmarks/speed/eval_throughput.py --config cpu-demo --max-questions 78 --modes generate@32,own@32,own@160 --rounds 2

`--modes decoder@batch,...` evaluates with each rollout-engine decoder (`generate`: transformers' loop,
the code before; `own`: `rollout/decode.py`; flags after a dash: `-noprefix` without the common-prefix prefill,
`-tokens` tokens only (no log-probs / entropies: what evaluation now runs), `-s2` decoded in 2 concurrent
parts (`rollout.decode_streams`), `-torch` torch's products instead of packed oneDNN weights
(`rollout.decode_matmul=torch`; own modes measured before 2026-11-26 ran that way), `-system` glibc's
malloc defaults (`run.malloc=system`; the other modes run under `reuse`, as `exgrpo evaluate` does; modes
measured before 2026-11-26 ran under `system`)) and batch size in turn, round after round, same seed:
the results file then holds each mode's median questions/s and its ratio to the first mode, with
`uptime` before and after (a shared machine: compare ratios, not seconds).

Runs the library directly (no Prefect / MLflow), with the preset's eval settings; the first
generate call is a warm-up on one question and is not counted. Writes results/eval_throughput_*.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_record import RESULTS, write_json  # noqa: E402
from exgrpo_core.config.load import load_config  # noqa: E402
from exgrpo_core.evaluation import evaluate as E  # noqa: E402
from exgrpo_core.models import load as models  # noqa: E402
from exgrpo_core.reward.grading import MathVerifier  # noqa: E402
from flows.eval_tasks import generation_args  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="cpu-demo")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--suite", default="bundled:arith-easy-test")
    p.add_argument("--max-questions", type=int, default=32, help="distinct questions per benchmark")
    p.add_argument("--tag", default=None, help="suffix of the results file (default: config + suite)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--modes", default=None, help="decoder@batch_size,... compared in turn (see above)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set + [f"eval.max_questions={args.max_questions}"])
    items = E.load_suite(args.suite, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
                         system_prompt=cfg.data.system_prompt, instruction=cfg.data.instruction,
                         max_questions=args.max_questions, prompt_template=cfg.data.prompt_template)
    model, tok = models.load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype,
                                    tiny=cfg.model.tiny.model_dump(), seed=cfg.run.seed)
    if torch.cuda.is_available():
        model = model.cuda()
    gen = generation_args(cfg)
    pass_k = gen.pop("pass_k")
    if args.modes:
        return compare_modes(args, cfg, items, model, tok, gen, pass_k)
    with MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers) as v:
        E.generate_and_grade(model, tok, items[:1], v.verify, **gen)  # warm-up
        t0 = time.perf_counter()
        report = E.evaluate_items(model, tok, items, v.verify, pass_k=pass_k, **gen, progress=lambda d, n: print(
            f"  {d}/{n} questions, {time.perf_counter() - t0:.1f} s", flush=True))
    samples = sum(r.n for r in report.questions)
    tokens = sum(r.response_tokens for r in report.questions)
    out = {
        "command": "python " + shlex.join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "load_average_1m_at_end": round(os.getloadavg()[0], 1)},  # shared machine: others' load
        "model": cfg.model.name_or_path, "suite": args.suite, "settings": gen,
        "questions": len(report.questions), "samples": samples, "generated_tokens": tokens,
        "seconds": round(report.seconds, 2),
        "questions_per_s": round(len(report.questions) / report.seconds, 3),
        "samples_per_s": round(samples / report.seconds, 3),
        "tokens_per_s": round(tokens / report.seconds, 1),
        "scores": report.summary(),
    }
    tag = args.tag or f"{args.config}_{args.suite.replace('bundled:', '').replace('/', '_')}"
    path = RESULTS / f"eval_throughput_{tag}.json"
    write_json(path, out)
    print(f"{out['questions']} questions, {samples} samples, {tokens} tokens in {out['seconds']} s: "
          f"{out['questions_per_s']} questions/s, {out['samples_per_s']} samples/s, {out['tokens_per_s']} tokens/s; "
          f"average pass@1 {100 * report.average['pass@1']:.1f}% -> {path}")


def compare_modes(args, cfg, items, model, tok, gen, pass_k) -> None:
    import hashlib
    import statistics
    import subprocess

    from exgrpo_core.rollout.engine import TransformersEngine
    from exgrpo_core.run import allocator

    modes = [(m.split("@")[0], int(m.split("@")[1])) for m in args.modes.split(",")]
    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    rows: dict[str, list[dict]] = {f"{d}@{b}": [] for d, b in modes}
    with MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers) as v:
        E.generate_and_grade(model, tok, items[:1], v.verify, **gen)  # warm-up
        for r in range(args.rounds):
            for decoder, batch in modes:
                engine = TransformersEngine(model, tok, top_p=gen["top_p"], batch_size=batch)
                engine.decoder, *flags = decoder.split("-")
                engine.min_prefix = 10 ** 9 if "noprefix" in flags else 2
                engine.scores = "tokens" not in flags  # evaluate_items's own engine computes tokens only
                engine.streams = next((int(f[1:]) for f in flags if f[:1] == "s" and f[1:].isdigit()), 1)
                engine.matmul = "torch" if "torch" in flags else "auto"
                allocator.use("system" if "system" in flags else "reuse")
                c0 = time.process_time()
                report = E.evaluate_items(model, tok, items, v.verify, pass_k=pass_k,
                                          **{**gen, "batch_size": batch}, engine=engine)
                q = len(report.questions)
                rows[f"{decoder}@{batch}"].append(dict(
                    seconds=report.seconds, cpu_s=time.process_time() - c0, questions_per_s=q / report.seconds,
                    tokens=sum(x.response_tokens for x in report.questions), row_steps=engine.row_steps,
                    responses_sha1=hashlib.sha1("\n\0".join(x.example for x in report.questions).encode()).hexdigest(),
                    pass_at_1=report.average["pass@1"]))
                print(f"round {r} {decoder}@{batch}: {report.seconds:.1f} s, {q / report.seconds:.2f} questions/s, "
                      f"row-steps {engine.row_steps}, pass@1 {report.average['pass@1']:.3f}", flush=True)
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    first = next(iter(rows))
    summary = {m: dict(questions_per_s=statistics.median(x["questions_per_s"] for x in xs),
                       cpu_s=statistics.median(x["cpu_s"] for x in xs),
                       cpu_speedup_vs_first=statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(xs, rows[first])),
                       speedup_vs_first=statistics.median(b["seconds"] / a["seconds"] for a, b in zip(xs, rows[first])))
               for m, xs in rows.items()}
    for m, x in summary.items():
        print(f"{m}: {x['questions_per_s']:.2f} questions/s, x{x['speedup_vs_first']:.2f} of {first}, cpu {x['cpu_s']:.1f} s")
    tag = args.tag or f"{args.config}_modes"
    path = RESULTS / f"eval_throughput_{tag}.json"
    write_json(path, dict(command="python " + shlex.join(sys.argv), torch_threads=torch.get_num_threads(),
                          date=datetime.now(timezone.utc).isoformat(timespec="seconds"), uptime=uptime,
                          questions=len(items), settings=gen, summary=summary, rounds=rows), indent=1)
    print(path, *uptime, sep="\n")


if __name__ == "__main__":
    main()
