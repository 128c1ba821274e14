"""The experience database at scale: the store paths one training iteration uses, at 10k-1M trajectories.

    python benchmarks/scale/db_scale.py                                # PostgreSQL + SQLite, 10k/100k/1M
    python benchmarks/scale/db_scale.py --sizes 10000,100000 --backends sqlite --repeats 3

For each backend and size: a fresh database (PostgreSQL: a new database on 127.0.0.1:5432, dropped
afterwards; SQLite: a file in /tmp, deleted afterwards) filled by `synth_store.fill`, then per repeat,
through `ExperienceStore` exactly as `exgrpo_core/loop.py` calls it:
  sample   sample_replay_questions of 64 replay questions: bucket sizes (max slot), then the drawn slots (plan_batch)
  fetch    what select_trajectories reads: candidates(payload=False) of those 64 questions (token ids of
           every pooled trajectory), then with_payloads of the one chosen per question (log-probs, text)
  fetch(full) candidates() with every payload, the read before selection fetched less (for comparison)
  sample(ref) the reference path it replaces: buffer_state + selection.sample_questions on a copy of the rng
           (the two must return the same questions and leave the same rng state; checked every repeat)
  metrics  buffer_state(with_buckets=False): the pool, retired and bucket sizes the loop logs every step
           (one aggregate); metrics(full) the whole buffer_state it read before (pooled uids listed too)
  update   apply_buffer_update of the paper's batch: 64 fresh x 8 + 64 replayed x 7 responses (update_buffer)
  replays  record_replays of the 64 chosen trajectories
  retired  retired_uids() (fresh sampling skips retired questions)
  retire   apply_buffer_update of 128 all-correct groups of pooled questions: 128 retirements at once
  rollback rollback_to(the filled step): undoes the repeat's two steps (resume from a checkpoint)
Each repeat ends with the rollback, so every repeat sees the same store. The in-memory baseline
(`inmemory_baseline.py`, the authors' per-bucket lists) is timed on the same simulated run and the same
batches. Medians over repeats; JSON with command, machine and date in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, write_json  # noqa: E402
from benchmarks.scale import inmemory_baseline, synth_store  # noqa: E402

from exgrpo_core.algorithm import selection  # noqa: E402
from exgrpo_core.store.engine import scratch_postgres_database  # noqa: E402
from exgrpo_core.store.experience_store import ExperienceStore  # noqa: E402
from exgrpo_core.types import GroupResult, Rollout  # noqa: E402

PG_ADMIN = os.environ.get("EXGRPO_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
OPS = ["sample", "fetch", "sample+fetch", "sample(ref)", "fetch(full)", "metrics", "metrics(full)", "update", "replays", "retired", "retire",
       "rollback"]
WORDS = "so we get then the sum is equal to both sides check answer step".split()


@contextmanager
def fresh_database(backend: str):
    """URL of a new empty database, removed afterwards."""
    if backend == "sqlite":
        path = Path(f"/tmp/exgrpo_dbscale_{uuid.uuid4().hex[:10]}.db")
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    with scratch_postgres_database(PG_ADMIN, "exgrpo_dbscale") as url:
        yield url


def make_group(rng: random.Random, uid: str, step: int, K: int, T: int, replay: bool, p: float) -> GroupResult:
    """A verified group with realistic payloads: K (or K-1 plus the replayed one) responses of up to T tokens."""
    n = K - 1 if replay else K
    rollouts = []
    for i in range(n):
        length = rng.randint(T // 4, T)
        ok = rng.random() < p
        text = f"bench {step} {uid} {i}: " + " ".join(rng.choices(WORDS, k=length)) + (" \\boxed{42}" if ok else "")
        rollouts.append(Rollout(uid, [1, 2, 3], [rng.randrange(49_152) for _ in range(length)],
                                [-rng.expovariate(2.5) for _ in range(length)], text, length == T, step,
                                reward=float(ok), entropy=rng.gammavariate(2.0, 0.2)))
    return GroupResult(uid, rollouts, is_replay=replay, replayed=int(replay))


def timed(times: dict, op: str, fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    times.setdefault(op, []).append(time.perf_counter() - t0)
    return out


def bench_size(backend: str, n: int, args) -> dict:
    K, T, seed = 8, args.response_tokens, args.seed
    nq = synth_store.default_questions(n)
    weights = selection.bucket_weights(K, "gaussian", 1.0, "count")
    rule = dict(group_size=K, collect=True, collect_min_k=1, collect_max_k=K - 1, retire=True, store_all=True)
    with fresh_database(backend) as url:
        t0 = time.perf_counter()
        run_id = synth_store.fill(url, n, seed=seed, response_tokens=T)
        fill_s = time.perf_counter() - t0
        store = ExperienceStore(url)
        base = store.get_run(run_id)["step"]
        rng = random.Random(seed)
        db, mem = {}, {}
        sim, _ = synth_store.simulate(n, nq, K, T, seed)
        buf = inmemory_baseline.load_from_simulation(sim, K, seed)
        del sim
        for _ in range(args.repeats):
            step = base + 1
            ref_rng = random.Random()
            ref_rng.setstate(rng.getstate())
            t0 = time.perf_counter()
            state = store.buffer_state(run_id, K)
            ref = selection.sample_questions(state.buckets, 64, weights, ref_rng)
            db.setdefault("sample(ref)", []).append(time.perf_counter() - t0)
            replay = timed(db, "sample", store.sample_replay_questions, run_id, K, 64, weights, rng)
            if replay != ref or rng.getstate() != ref_rng.getstate():
                raise RuntimeError("sample_replay_questions differs from sample_questions(buffer_state)")
            t0 = time.perf_counter()
            cands = store.candidates(run_id, replay, before_step=step, payload=False)
            best = [min(c, key=lambda e: e.entropy) for c in cands.values() if c]  # stands in for the scoring
            best = store.with_payloads(run_id, best)
            db.setdefault("fetch", []).append(time.perf_counter() - t0)
            db.setdefault("sample+fetch", []).append(db["sample"][-1] + db["fetch"][-1])
            full = timed(db, "fetch(full)", store.candidates, run_id, replay, before_step=step)
            if [e.behaviour_logprobs for e in best] != [
                    next(f for f in full[e.question_uid] if f.id == e.id).behaviour_logprobs for e in best]:
                raise RuntimeError("with_payloads differs from candidates(payload=True)")
            counts = timed(db, "metrics", store.buffer_state, run_id, K, with_buckets=False)
            whole = timed(db, "metrics(full)", store.buffer_state, run_id, K)
            if counts != type(whole)(**{**whole.__dict__, "buckets": {}}):
                raise RuntimeError("buffer_state(with_buckets=False) differs from buffer_state's sizes")
            retired = timed(db, "retired", store.retired_uids, run_id)
            pooled = {u for v in state.buckets.values() for u in v}
            free = [f"synth-{i}" for i in range(nq) if f"synth-{i}" not in retired and f"synth-{i}" not in replay]
            fresh = rng.sample(free, 64)
            groups = [make_group(rng, u, step, K, T, False, rng.random()) for u in fresh]
            groups += [make_group(rng, u, step, K, T, True, rng.random()) for u in replay]
            timed(db, "update", store.apply_buffer_update, run_id, step, groups, **rule)
            chosen = [(e.id, 0.3) for e in best]
            timed(db, "replays", store.record_replays, run_id, step, chosen)
            solved = rng.sample(sorted(pooled - set(replay) - set(fresh)), min(128, len(pooled) // 2))
            retire = [make_group(rng, u, step + 1, K, T, False, 1.0) for u in solved]
            timed(db, "retire", store.apply_buffer_update, run_id, step + 1, retire, **rule)
            timed(db, "rollback", store.rollback_to, run_id, base)
            # the authors' in-memory buffer on the same batches
            mreplay = timed(mem, "sample", buf.sample, 64, weights, rng)
            timed(mem, "fetch", buf.candidates, mreplay)
            mem.setdefault("sample+fetch", []).append(mem["sample"][-1] + mem["fetch"][-1])
            timed(mem, "update", buf.update, step, groups)
            timed(mem, "retire", buf.update, step + 1, retire)
        size = _db_bytes(store, url)
        final = store.buffer_state(run_id, K)
        store.close()
    med = {op: statistics.median(v) for op, v in db.items()}
    return dict(backend=backend, n_trajectories=n, n_questions=nq, fill_s=fill_s, db_bytes=size,
                pool_questions=final.pool_questions, pool_trajectories=final.pool_trajectories,
                retired_questions=final.retired_questions, candidates_fetched=sum(len(c) for c in cands.values()),
                median_s=med, inmemory_median_s={op: statistics.median(v) for op, v in mem.items()},
                samples_s=db, inmemory_samples_s=mem)


def _db_bytes(store: ExperienceStore, url: str) -> int:
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect() as c:
            return int(c.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one())
    path = make_url(url).database
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def machine() -> dict:
    with psycopg.connect(make_url(PG_ADMIN).set(drivername="postgresql").render_as_string(hide_password=False)) as c:
        pg = c.execute("SHOW server_version").fetchone()[0]
    return dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), python=platform.python_version(), postgresql=pg, sqlite=sqlite3.sqlite_version)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'backend':<9} {'trajectories':>12} " + " ".join(f"{op:>12}" for op in OPS) + "   (median ms)")
    for r in rows:
        print(f"{r['backend']:<9} {r['n_trajectories']:>12,} "
              + " ".join(f"{r['median_s'][op] * 1e3:>12.1f}" for op in OPS))
        mem = r["inmemory_median_s"]
        print(f"{'in-memory':<9} {r['n_trajectories']:>12,} "
              + " ".join(f"{mem[op] * 1e3:>12.1f}" if op in mem else f"{'-':>12}" for op in OPS))


def markdown_table(rows: list[dict]) -> str:
    """The results table (docs/benchmarks/scale.md): median ms per operation, database and in-memory baseline side by side."""
    lines = ["| backend | trajectories | " + " | ".join(OPS) + " |", "|---|---:|" + "---:|" * len(OPS)]
    for r in rows:
        for name, med in ((r["backend"], r["median_s"]), ("in-memory", r["inmemory_median_s"])):
            cells = [f"{med[op] * 1e3:.1f}" if op in med else "-" for op in OPS]
            lines.append(f"| {name} | {r['n_trajectories']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--backends", default="postgres,sqlite")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--response-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "db_scale.json"))
    ap.add_argument("--render", metavar="JSON", help="only print the markdown table of a results file")
    args = ap.parse_args()
    if args.render:
        print(markdown_table(json.loads(Path(args.render).read_text())["results"]))
        return
    load_start, rows = os.getloadavg(), []
    for backend in args.backends.split(","):
        for n in [int(s) for s in args.sizes.split(",")]:
            rows.append(bench_size(backend, n, args))
            print(f"{backend} {n:,}: filled in {rows[-1]['fill_s']:.0f} s, "
                  f"{rows[-1]['db_bytes'] / 2**20:.0f} MiB", flush=True)
    print_table(rows)
    result = dict(command="python " + " ".join(sys.argv), date=datetime.datetime.now().isoformat(timespec="seconds"),
                  machine=machine(), load_average_start_end=[load_start, os.getloadavg()],
                  response_tokens=args.response_tokens, repeats=args.repeats, results=rows)
    print("\n" + markdown_table(rows))
    write_json(args.out, result, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
