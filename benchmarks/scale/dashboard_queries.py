"""Dashboard page query times on large synthetic experience databases: SQLite and PostgreSQL.

    python benchmarks/scale/dashboard_queries.py                                   # 10k, 100k, 1M on both backends
    python benchmarks/scale/dashboard_queries.py --sizes 10000 --backends sqlite   # a quick look

Each database is filled by `benchmarks/scale/synth_store.py` (a simulated ExGRPO run through the real
schema), then every query a page issues on first load is timed through the dashboard's own
read-only engine, without Streamlit's cache: `cold` is the first call, `warm` the median of the
repeats. PostgreSQL runs in a fresh database that is dropped afterwards. Results:
benchmarks/results/dashboard_queries.json (with the command, machine and date).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, write_json  # noqa: E402
from benchmarks.scale.synth_store import fill  # noqa: E402
from dashboard import db, queries as Q  # noqa: E402
from exgrpo_core import metrics as M  # noqa: E402
from exgrpo_core.store.engine import scratch_postgres_database  # noqa: E402

PG_ADMIN = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def page_queries(url: str, run_id: str, K: int, full_range: bool) -> dict[str, list[tuple[str, callable]]]:
    """The queries each page issues on first load (as in dashboard/views/*.py), as named thunks."""
    buffer_keys = (M.BUFFER_QUESTIONS, M.BUFFER_TRAJECTORIES, M.RETIRED_QUESTIONS, M.IW_MEAN, M.IW_MAX, M.IW_VAR,
                   M.SHAPED_IW_MEAN, M.REPLAYED_SAMPLES, *(M.bucket_key(k) for k in range(K + 1)))
    first, last = Q.step_bounds(url, run_id)
    lo = first if full_range else max(first, last - Q.ENTROPY_DEFAULT_STEPS + 1)  # the page's default range
    top, _ = Q.search_questions(url, run_id, offset=0, limit=25)
    qid = int(top.question_id.iloc[0])
    return {
        "runs": [("list_runs", lambda: Q.list_runs(url)),
                 ("curves", lambda: Q.metric_series(url, (run_id,), (M.REWARD_MEAN, M.FRESH_PASS1)))],
        "buffer": [("list_runs", lambda: Q.list_runs(url)),
                   ("metric_series", lambda: Q.metric_series(url, (run_id,), buffer_keys)),
                   ("buffer_now", lambda: Q.buffer_now(url, run_id)),
                   ("replay_buckets", lambda: Q.replay_buckets(url, run_id)),
                   ("target_weights", lambda: Q.target_weights(url, run_id))],
        f"entropy{' (all steps)' if full_range else ''}": [
            ("step_bounds", lambda: Q.step_bounds(url, run_id)),
            ("hist_correct", lambda: Q.entropy_histogram(url, run_id, lo, last, "correct")),
            ("hist_source", lambda: Q.entropy_histogram(url, run_id, lo, last, "source")),
            ("hist_bucket", lambda: Q.entropy_histogram(url, run_id, lo, last, "bucket")),
            ("replay_by_step", lambda: Q.replay_entropy_by_step(url, run_id)),
            ("fresh_entropy", lambda: Q.metric_series(url, (run_id,), (M.FRESH_ENTROPY,)))],
        "experience": [("count", lambda: Q.search_questions(url, run_id, rolled_out=True, offset=0, limit=1)),
                       ("page", lambda: Q.search_questions(url, run_id, rolled_out=True, offset=0, limit=25)),
                       ("text_search", lambda: Q.search_questions(url, run_id, text="7 +", limit=25)),
                       ("bucket_filter", lambda: Q.search_questions(url, run_id, bucket=K // 2, limit=25)),
                       ("groups", lambda: Q.question_groups(url, run_id, qid)),
                       ("trajectories", lambda: Q.question_trajectories(url, run_id, qid, limit=20))],
        "results": [("eval_results", lambda: Q.eval_results(url, (run_id,))),
                    ("metric_keys", lambda: Q.metric_keys(url, (run_id,))),
                    ("curves", lambda: Q.metric_series(url, (run_id,), (M.REWARD_MEAN, M.FRESH_PASS1)))],
    }


def time_pages(url: str, run_id: str, K: int, repeats: int) -> dict[str, dict]:
    """{page: {"cold_s", "warm_s", "queries": {name: warm seconds}}} (cold: first call after the fill)."""
    out = {}
    for full in (False, True):
        for page, thunks in page_queries(url, run_id, K, full).items():
            if full and not page.startswith("entropy"):
                continue
            cold = sum(_timed(fn) for _, fn in thunks)
            per = {name: statistics.median(_timed(fn) for _ in range(repeats)) for name, fn in thunks}
            out[page] = {"cold_s": round(cold, 4), "warm_s": round(sum(per.values()), 4),
                         "queries": {k: round(v, 4) for k, v in per.items()}}
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pg_database() -> tuple[str, callable]:
    """A fresh PostgreSQL database and the function that drops it."""
    scratch = scratch_postgres_database(PG_ADMIN, "exgrpo_dash_bench")
    url = scratch.__enter__()

    def drop() -> None:
        db.readonly_engine.cache_clear()
        scratch.__exit__(None, None, None)

    return url, drop


def bench_one(backend: str, n: int, repeats: int, tmp: Path) -> dict:
    if backend == "sqlite":
        path = tmp / f"dash_{n}.db"
        url, drop = f"sqlite:///{path}", lambda: (db.readonly_engine.cache_clear(), path.unlink(missing_ok=True))
    else:
        url, drop = _pg_database()
    try:
        t0 = time.perf_counter()
        run_id = fill(url, n, seed=0)
        fill_s = time.perf_counter() - t0
        if backend == "postgresql":  # what autovacuum does after a bulk load (PG 13+ vacuums on inserts too)
            with sa.create_engine(url, isolation_level="AUTOCOMMIT").connect() as c:
                c.execute(sa.text("VACUUM ANALYZE"))
        K = int(Q.list_runs(url).set_index("id").loc[run_id, "group_size"])
        with db.readonly_engine(url).connect() as c:
            n_traj = int(c.execute(sa.text("select count(*) from trajectories")).scalar())
        pages = time_pages(url, run_id, K, repeats)
    finally:
        drop()
    return {"backend": backend, "trajectories": n_traj, "fill_s": round(fill_s, 1), "pages": pages}


def print_table(rows: list[dict]) -> None:
    pages = list(rows[0]["pages"])
    print(f"{'backend':<11}{'trajectories':>13}  " + "".join(f"{p:>22}" for p in pages))
    for r in rows:
        cells = "".join(f"{r['pages'][p]['warm_s'] * 1000:>10.1f} ms ({r['pages'][p]['cold_s'] * 1000:>6.0f})"
                        for p in pages)
        print(f"{r['backend']:<11}{r['trajectories']:>13,}  {cells}")
    print("per page: warm = median of repeats, summed over the page's queries; (cold first call) in ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "dashboard_queries.json"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="exgrpo-dash-bench-") as tmp:
        for backend in args.backends:
            for n in args.sizes:
                rows.append(bench_one(backend, n, args.repeats, Path(tmp)))
                print(f"{backend} {n:,}: fill {rows[-1]['fill_s']} s", flush=True)
    print_table(rows)
    result = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
              "date": date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} (CPU only), "
                         f"shared with other jobs",
              "note": "seconds per page load without Streamlit's cache (the dashboard caches each query for 10 s); "
                      "cold = first call in this process, files may sit in the OS cache after the fill; the machine "
                      "ran other jobs meanwhile (load 10-20 on 2 cores), so read ratios more than absolute times",
              "results": rows}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
