"""What a reward of your own costs per step beside math-verify (docs/rewards.md):

    python benchmarks/speed/reward_sources.py --items 512 --repeats 3

Scores the same `--items` responses (worked answers of arith3 questions, half right) with math-verify
(`MathVerifier`), the shipped `exact_match` and `arith_format` reward functions (`RewardFunctionPool`, the
same killable worker processes), and `arith_format` through a reward server on this machine
(`python -m exgrpo_core.reward.serve`, batches of 64). One worker each; the sources interleaved per repeat,
median seconds reported, with the load average. Writes results/reward_sources.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import save_result  # noqa: E402


def items(n: int) -> tuple[list[str], list[str]]:
    from exgrpo_core.data import arith3

    problems = arith3.split("train")[:n]
    responses = [arith3.solutions(op, a, b)[0] + ("" if i % 2 else "1") for i, (op, a, b) in enumerate(problems)]
    return responses, [str(arith3.result(op, a, b)) for op, a, b in problems]


def main() -> int:
    from exgrpo_core.reward.grading import MathVerifier
    from exgrpo_core.reward.plugins import RewardFunctionPool
    from exgrpo_core.reward.remote import RewardServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    responses, answers = items(a.items)
    rows = [{"answer": x} for x in answers]
    server = subprocess.Popen([sys.executable, "-m", "exgrpo_core.reward.serve", "--fn", "arith_format", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().split(" on ")[1].strip()
    mv, em, af = MathVerifier(30.0), RewardFunctionPool("exact_match", 30.0), RewardFunctionPool("arith_format", 30.0)
    remote = RewardServer(url, batch_size=64)
    sources = {"math-verify": lambda: mv.verify(responses, answers),
               "reward.fn=exact_match": lambda: em.score_rows(responses, rows),
               "reward.fn=arith_format": lambda: af.score_rows(responses, rows),
               "reward.url (arith_format)": lambda: remote.score_rows(responses, rows)}
    times: dict[str, list[float]] = {k: [] for k in sources}
    try:
        for fn in sources.values():
            fn()  # warm: worker start, math-verify's import, the gold cache
        for _ in range(a.repeats):
            for name, fn in sources.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    finally:
        for pool in (mv, em, af):
            pool.close()
        server.kill()
    base = statistics.median(times["math-verify"])
    print(f"{a.items} items, median of {a.repeats} (load {os.getloadavg()[0]:.1f})")
    print("| source | seconds | ms per item | vs math-verify |\n|---|---|---|---|")
    out = {}
    for name, ts in times.items():
        m = statistics.median(ts)
        out[name] = {"median_s": m, "ms_per_item": 1000 * m / a.items, "ratio_to_math_verify": m / base, "all_s": ts}
        print(f"| {name} | {m:.3f} | {1000 * m / a.items:.2f} | {m / base:.2f}x |")
    save_result("reward_sources.json", {"items": a.items, "repeats": a.repeats, "sources": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
