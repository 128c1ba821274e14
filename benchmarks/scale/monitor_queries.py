"""Query times of the monitor banner and the Staleness page on large synthetic experience databases.

    python benchmarks/scale/monitor_queries.py                                   # 10k, 100k on SQLite and PostgreSQL
    python benchmarks/scale/monitor_queries.py --sizes 1000000 --backends postgresql

Databases are filled as in benchmarks/scale/dashboard_queries.py (`synth_store.fill`: a simulated run with
the paper's batch), plus a `monitor/<name>` firing at every 10th step for three monitors; each query
is timed through the dashboard's read-only engine without Streamlit's cache (warm = median of the
repeats, cold = first call). Results: benchmarks/results/monitor_queries.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, write_json  # noqa: E402
from benchmarks.scale.dashboard_queries import _pg_database, _timed  # noqa: E402
from benchmarks.scale.synth_store import fill  # noqa: E402
from dashboard import db, monitor_queries as MQ, queries as Q  # noqa: E402
from exgrpo_core import metrics as M  # noqa: E402
from exgrpo_core.observe import staleness  # noqa: E402
from exgrpo_core.store.experience_store import ExperienceStore  # noqa: E402


def add_firings(url: str, run_id: str) -> int:
    """monitor/<name> at every 10th step for three monitors, as a run that keeps warning would have."""
    with ExperienceStore(url) as store:
        last = store.get_run(run_id)["step"]
        steps = range(0, last + 1, 10)
        for step in steps:
            store.log_metrics(run_id, step, {M.monitor_key(n): 1.0 for n in ("fresh_entropy", "iw_max", "unfilled_slots")})
    return 3 * len(steps)


def bench_one(backend: str, n: int, repeats: int, tmp: Path) -> dict:
    if backend == "sqlite":
        path = tmp / f"mon_{n}.db"
        url, drop = f"sqlite:///{path}", lambda: (db.readonly_engine.cache_clear(), path.unlink(missing_ok=True))
    else:
        url, drop = _pg_database()
    try:
        run_id = fill(url, n, seed=0)
        firings = add_firings(url, run_id)
        last = int(Q.list_runs(url).set_index("id").loc[run_id, "step"])  # steps completed
        runs = tuple(Q.list_runs(url).id)
        thunks = {"banner: monitor_firings": lambda: MQ.monitor_firings(url, runs),
                  "banner: run_settings": lambda: MQ.run_settings(url, runs),
                  "staleness: replay_ages (last 50 steps, the default)":
                      lambda: MQ.replay_ages(url, run_id, max(0, last - 50)),
                  "staleness: replay_ages (all steps)": lambda: MQ.replay_ages(url, run_id),
                  "staleness: metric_series": lambda: Q.metric_series(url, (run_id,), (*staleness.KEYS, M.REPLAYED_SAMPLES))}
        cold = {k: _timed(fn) for k, fn in thunks.items()}
        warm = {k: statistics.median(_timed(fn) for _ in range(repeats)) for k, fn in thunks.items()}
        ages = MQ.replay_ages(url, run_id)
    finally:
        drop()
    return {"backend": backend, "trajectories": n, "replays": int(ages.replayed.sum()), "firings": firings,
            "queries": {k: {"cold_s": round(cold[k], 4), "warm_s": round(warm[k], 4)} for k in thunks}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "monitor_queries.json"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="exgrpo-mon-bench-") as tmp:
        for backend in args.backends:
            for n in args.sizes:
                rows.append(bench_one(backend, n, args.repeats, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    result = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
              "date": date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} (CPU only), shared with "
                         "other jobs",
              "note": "seconds per query without Streamlit's cache (the dashboard caches each for 10 s); the machine "
                      "ran other jobs meanwhile, so read ratios more than absolute times", "results": rows}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
