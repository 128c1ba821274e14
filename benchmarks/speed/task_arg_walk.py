"""What Prefect's walk of a task's arguments costs as the dataset grows (flows/task_args.py).

    python benchmarks/speed/task_arg_walk.py --questions 512,7473,46000 --rounds 3

Before a task runs, Prefect visits every argument twice, element by element: once to record upstream
task runs (`collect_task_run_inputs_sync`) and once to resolve futures (`visit_collection` with
`resolve_to_final_result`). The train flow passes the Session (every question, and the prompt-token
cache of each question sampled so far) to each of its 7 tasks per iteration. This times both walks
over a Session-shaped dataclass with N questions (a GSM8K-style prompt, a 120-token cached prompt each),
plain and wrapped in `opaque` as the flow passes it now. Writes results/task_arg_walk.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TASKS_PER_ITERATION = 7


@dataclass
class FakeSession:
    questions: dict
    _prompt_cache: dict = field(default_factory=dict)


def session(n: int) -> FakeSession:
    from exgrpo_core.types import Question

    text = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " * 2
    qs = {f"q{i}": Question(uid=f"q{i}", messages=({"role": "user", "content": f"{text} ({i})"},), answer=str(i))
          for i in range(n)}
    return FakeSession(qs, {u: list(range(120)) for u in qs})


def walk_seconds(arg, rounds: int) -> float:
    """Median seconds of Prefect's two pre-run walks over one argument."""
    from prefect.utilities.collections import visit_collection
    from prefect.utilities.engine import collect_task_run_inputs_sync, resolve_to_final_result

    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        collect_task_run_inputs_sync(arg)
        visit_collection(arg, visit_fn=resolve_to_final_result, return_data=True, max_depth=-1,
                         remove_annotations=True, context={})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default="512,7473,46000", help="dataset sizes (arith-fast, GSM8K train, ~OpenR1)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from prefect.utilities.annotations import opaque

    from benchmarks.bench_record import save_result

    rows = []
    print(f"{'questions':>9} {'plain ms':>10} {'opaque ms':>10} {'plain s/iteration':>18}")
    for n in (int(x) for x in a.questions.split(",")):
        s = session(n)
        plain, whole = walk_seconds(s, a.rounds), walk_seconds(opaque(s), a.rounds)
        rows.append({"questions": n, "plain_ms": 1e3 * plain, "opaque_ms": 1e3 * whole,
                     "plain_s_per_iteration": TASKS_PER_ITERATION * plain})
        print(f"{n:>9} {1e3 * plain:>10.1f} {1e3 * whole:>10.3f} {TASKS_PER_ITERATION * plain:>18.2f}")
    save_result("task_arg_walk.json", {"rounds": a.rounds, "tasks_per_iteration": TASKS_PER_ITERATION, "rows": rows})


if __name__ == "__main__":
    main()
