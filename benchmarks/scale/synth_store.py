"""Fill an experience database with a realistic synthetic ExGRPO run, fast (bulk COPY / executemany).

    python benchmarks/scale/synth_store.py --url postgresql+psycopg://postgres@127.0.0.1:5432/bench --n 1000000
    python benchmarks/scale/synth_store.py --url sqlite:////tmp/synth.db --n 100000 --response-tokens 1024

The run is simulated step by step with the paper's batch (128 questions x K responses, rho = 0.5
once replay starts) and the project's own rules (docs/implementation_details.md): questions have a hidden difficulty that
eases as training goes on; every group is recorded; with `store_all_rollouts` (the default) every
fresh response is a trajectory; correct responses of groups with 1 <= k <= K-1 join the pool once
replay is active; k = K retires the question; replayed questions are drawn with the real
`selection.sample_questions` and replay their lowest-entropy pooled trajectory. Questions and the
run go through `ExperienceStore` (schema migrated); the bulk rows go straight through the driver
(PostgreSQL COPY BINARY, sqlite3 executemany) in one transaction.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from exgrpo_core import metrics as M  # noqa: E402
from exgrpo_core.algorithm import selection  # noqa: E402
from exgrpo_core.store.experience_store import ExperienceStore  # noqa: E402
from exgrpo_core.types import Question  # noqa: E402

BATCH = 128  # questions per step (paper)
REPLAY = 64  # experiential questions per step once replay is on (rho = 0.5)
VOCAB = 49_152  # token ids drawn below this (SmolLM2's vocabulary size)
WORDS = ("the", "so", "we", "get", "then", "let", "sum", "of", "is", "=", "+", "-", "*", "/", "x", "y",
         "therefore", "compute", "first", "next", "because", "value", "equation", "both", "sides", "2", "3",
         "7", "12", "45", "answer", "check", "step", "multiply", "divide", "substitute", "simplify")


@dataclass
class Sim:
    """The simulated run in arrays: one entry per question (q_*) and per trajectory (t_*)."""

    n_questions: int
    K: int
    q_latest: np.ndarray = None
    q_groups: np.ndarray = None
    q_last: np.ndarray = None
    q_retired_step: np.ndarray = None  # -1: not retired
    q_replayed: np.ndarray = None
    pool: list = field(default_factory=list)  # per question: pooled trajectory ordinals
    t_cols: dict = field(default_factory=lambda: {k: [] for k in (
        "qid", "step", "reward", "entropy", "length", "in_pool", "retired")})
    groups: list = field(default_factory=list)  # (q, step, k, n, is_replay)
    replays: list = field(default_factory=list)  # (trajectory ordinal, q, step, entropy)
    metrics: list = field(default_factory=list)  # (step, key, value)

    def __post_init__(self):
        n = self.n_questions
        self.q_latest = np.full(n, -1, np.int64)
        self.q_groups = np.zeros(n, np.int64)
        self.q_last = np.full(n, -1, np.int64)
        self.q_retired_step = np.full(n, -1, np.int64)
        self.q_replayed = np.zeros(n, np.int64)
        self.pool = [[] for _ in range(n)]

    @property
    def n_traj(self) -> int:
        return len(self.t_cols["qid"])


def simulate(n_trajectories: int, n_questions: int, K: int, response_tokens: int, seed: int) -> tuple[Sim, dict]:
    """Run the ExGRPO bookkeeping until n_trajectories responses are stored (the last group may overshoot)."""
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    sim = Sim(n_questions, K)
    skill = rng.normal(-0.4, 1.6, n_questions)  # logit of each question's starting accuracy
    t_entropy = sim.t_cols["entropy"]
    replay_ttimes: dict[int, tuple[int, int]] = {}  # trajectory ordinal -> (times replayed, last step)
    weights = selection.bucket_weights(K, "gaussian", 1.0, "count")
    order: list[int] = []
    replay_on, started, step = False, None, 0
    expected_steps = max(1, n_trajectories // (BATCH * K - REPLAY))
    while sim.n_traj < n_trajectories:
        retired = sim.q_retired_step >= 0
        replay_q: list[int] = []
        if replay_on:
            live = np.nonzero(~retired & (np.fromiter(map(len, sim.pool), np.int64, n_questions) > 0))[0]
            buckets: dict[int, list[int]] = {}
            for q, k in zip(live.tolist(), sim.q_latest[live].tolist()):
                buckets.setdefault(k, []).append(q)
            replay_q = selection.sample_questions(buckets, REPLAY, weights, prng)
        fresh_q: list[int] = []
        taken = set(replay_q)
        while len(fresh_q) < BATCH - len(replay_q):
            if not order:  # a new pass over the unretired questions (skip_retired_fresh)
                order = rng.permutation(np.nonzero(~retired)[0] if (~retired).sum() > BATCH else n_questions).tolist()
            q = order.pop()
            if q not in taken and not (retired[q] and (~retired).sum() > BATCH):
                taken.add(q)
                fresh_q.append(q)
        p = 1 / (1 + np.exp(-(skill + 2.5 * step / expected_steps)))  # accuracy eases with training
        correct_total, n_total = 0, 0
        for q, is_replay in [(q, False) for q in fresh_q] + [(q, True) for q in replay_q]:
            if sim.n_traj >= n_trajectories:  # the last step stops at a group boundary
                break
            n = K - 1 if is_replay else K
            c = int(rng.binomial(n, p[q]))
            k = c + int(is_replay)
            correct_total, n_total = correct_total + c, n_total + n
            if is_replay:  # replay the lowest-entropy pooled trajectory (argmin)
                t = min(sim.pool[q], key=t_entropy.__getitem__)
                times, _ = replay_ttimes.get(t, (0, step))
                replay_ttimes[t] = (times + 1, step)
                sim.q_replayed[q] += 1
                sim.replays.append((t, q, step, t_entropy[t] + float(rng.normal(0, 0.05))))
            collect = replay_on and 1 <= k <= K - 1
            was_retired = bool(sim.q_retired_step[q] >= 0)
            retire = k == K and not was_retired
            for i in range(n):
                ok = i < c
                sim.t_cols["qid"].append(q)
                sim.t_cols["step"].append(step)
                sim.t_cols["reward"].append(1.0 if ok else 0.0)
                t_entropy.append(float(rng.gamma(2.0, 0.2)))
                sim.t_cols["length"].append(int(rng.integers(response_tokens // 4, response_tokens + 1)))
                pooled = ok and collect and not was_retired
                sim.t_cols["in_pool"].append(pooled)
                sim.t_cols["retired"].append(ok and collect and was_retired)
                if pooled:
                    sim.pool[q].append(sim.n_traj - 1)
            if retire:
                sim.q_retired_step[q] = step
                for t in sim.pool[q]:
                    sim.t_cols["in_pool"][t], sim.t_cols["retired"][t] = False, True
                sim.pool[q] = []
            sim.q_latest[q], sim.q_groups[q], sim.q_last[q] = k, sim.q_groups[q] + 1, step
            sim.groups.append((q, step, k, n + int(is_replay), is_replay))
        frac = correct_total / max(n_total, 1)
        if not replay_on and selection.replay_should_start(frac, 0.35):
            replay_on, started = True, step
        _step_metrics(sim, step, frac, len(replay_q), rng)
        step += 1
    run = dict(step=step - 1, replay_active=replay_on, replay_started_step=started, replay_ttimes=replay_ttimes)
    return sim, run


def _step_metrics(sim: Sim, step: int, frac: float, n_replayed: int, rng: np.random.Generator) -> None:
    """One row per declared metric (the metric contract): buffer counts are the simulation's, the rest plausible."""
    live = sim.q_latest >= 0
    values = {key: float(rng.gamma(2.0, 0.5)) for key in M.STEP_METRICS}
    values.update({M.REWARD_MEAN: frac, M.REPLAYED_SAMPLES: float(n_replayed),
                   M.RETIRED_QUESTIONS: float((sim.q_retired_step >= 0).sum()),
                   M.BUFFER_QUESTIONS: float(sum(1 for p in sim.pool if p)),
                   M.BUFFER_TRAJECTORIES: float(sum(len(p) for p in sim.pool)),
                   M.REPLAY_ACTIVE: float(n_replayed > 0)})
    counts = np.bincount(sim.q_latest[live], minlength=sim.K + 1)
    values.update({M.bucket_key(k): float(counts[k]) for k in range(sim.K + 1)})
    sim.metrics.extend((step, k, v) for k, v in values.items())


class Writer:
    """Bulk rows straight through the driver: COPY BINARY on PostgreSQL, executemany on SQLite."""

    def __init__(self, conn):
        self.conn, self.pg = conn, conn.dialect.name == "postgresql"
        self.raw = conn.connection.driver_connection

    def max_id(self, table: str) -> int:
        cur = self.raw.cursor()
        cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")
        return int(cur.fetchone()[0])

    def write(self, table: str, cols: list[tuple[str, str]], rows) -> None:
        names = ", ".join(c for c, _ in cols)
        cur = self.raw.cursor()
        if self.pg:
            with cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types([t for _, t in cols])
                for row in rows:
                    copy.write_row(row)
        else:
            cur.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})", rows)

    def fix_sequence(self, table: str) -> None:
        if self.pg:
            self.raw.cursor().execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                      f"(SELECT COALESCE(MAX(id), 1) FROM {table}))")


T_COLS = [("id", "int8"), ("run_id", "varchar"), ("question_id", "int4"), ("step", "int4"),
          ("collected_step", "int4"), ("reward", "float8"), ("entropy", "float8"), ("length", "int4"),
          ("truncated", "bool"), ("text", "text"), ("text_sha1", "varchar"), ("token_ids", "bytea"),
          ("behaviour_logprobs", "bytea"), ("in_pool", "bool"), ("retired", "bool"),
          ("times_replayed", "int4"), ("last_replayed_step", "int4")]


def _trajectory_rows(sim: Sim, run_id: str, qids: list[int], base: int, run: dict, response_tokens: int,
                     seed: int, chunk: int = 20_000):
    """Trajectory rows with int32 token ids / float32 log-probs payloads and text, generated chunk by chunk."""
    rng = np.random.default_rng(seed + 1)
    corpus = " ".join(rng.choice(WORDS, 400_000))
    c = sim.t_cols
    for lo in range(0, sim.n_traj, chunk):
        hi = min(lo + chunk, sim.n_traj)
        lengths = np.asarray(c["length"][lo:hi])
        ends = np.cumsum(lengths) * 4
        starts = ends - lengths * 4
        ids = rng.integers(0, VOCAB, int(lengths.sum()), dtype=np.int32).astype("<i4").tobytes()
        lps = (-rng.exponential(0.4, int(lengths.sum()))).astype("<f4").tobytes()
        offs = rng.integers(0, len(corpus) - 4 * response_tokens - 1, hi - lo)
        for j, t in enumerate(range(lo, hi)):
            n = int(lengths[j])
            ok = c["reward"][t] > 0
            text = (f"Attempt {t}: {corpus[offs[j]:offs[j] + 4 * n]} so the answer is "
                    f"\\boxed{{{(t * 7919) % 1000 if not ok else 42}}}.")
            times, last = run["replay_ttimes"].get(t, (0, None))
            yield (base + t + 1, run_id, qids[c["qid"][t]], c["step"][t], c["step"][t], c["reward"][t],
                   c["entropy"][t], n, n == response_tokens, text, hashlib.sha1(text.encode()).hexdigest(),
                   ids[starts[j]:ends[j]], lps[starts[j]:ends[j]], c["in_pool"][t], c["retired"][t], times, last)


def default_questions(n_trajectories: int) -> int:
    """Dataset size for a run of n trajectories: about 20 stored responses per question."""
    return max(256, n_trajectories // 20)


def fill(db_url: str, n_trajectories: int, *, seed: int = 0, group_size: int = 8, response_tokens: int = 256,
         run_name: str = "synthetic", n_questions: int | None = None) -> str:
    """Store a synthetic run of about `n_trajectories` trajectories (at most group_size more); returns its run id.

    n_questions defaults to `default_questions`: 50k at 1M, near the paper's 46k training set.
    """
    if n_trajectories < 1 or group_size < 2 or response_tokens < 4:
        raise ValueError(f"need n_trajectories >= 1, group_size >= 2, response_tokens >= 4; got "
                         f"{n_trajectories}, {group_size}, {response_tokens}")
    n_questions = n_questions or default_questions(n_trajectories)
    if n_questions < BATCH:
        raise ValueError(f"n_questions must be >= {BATCH} (one batch), got {n_questions}")
    run_id = uuid.uuid4().hex
    sim, run = simulate(n_trajectories, n_questions, group_size, response_tokens, seed)
    store = ExperienceStore(db_url)
    try:
        store.start_run(run_id, run_name, "synthetic", {"synthetic": True, "seed": seed,
                                                        "response_tokens": response_tokens}, group_size)
        words = np.random.default_rng(seed + 2).choice(WORDS, (n_questions, 24))
        qs = [Question(uid=f"synth-{i}", source="synthetic", answer=str(i % 1000), messages=(
            {"role": "user", "content": f"Problem {i} ({run_id[:8]}): {' '.join(w)}?"},)) for i, w in enumerate(words)]
        store.register_questions(run_id, qs)
        _write_all(store, run_id, sim, run, response_tokens, seed)
        store.update_run(run_id, step=run["step"], status="finished", replay_active=run["replay_active"],
                         replay_started_step=run["replay_started_step"])
    finally:
        store.close()
    return run_id


def _write_all(store: ExperienceStore, run_id: str, sim: Sim, run: dict, response_tokens: int, seed: int) -> None:
    from sqlalchemy import select

    from exgrpo_core.store.tables import QuestionState
    with store.engine.begin() as conn:
        qid_of = dict(conn.execute(select(QuestionState.uid, QuestionState.question_id)
                                   .where(QuestionState.run_id == run_id)).all())
        qids = [qid_of[f"synth-{i}"] for i in range(sim.n_questions)]
        w = Writer(conn)
        base = w.max_id("trajectories")
        w.write("trajectories", T_COLS, _trajectory_rows(sim, run_id, qids, base, run, response_tokens, seed))
        g_base = w.max_id("group_results")
        w.write("group_results", [("id", "int8"), ("run_id", "varchar"), ("question_id", "int4"), ("step", "int4"),
                                  ("k", "int4"), ("n", "int4"), ("is_replay", "bool")],
                ((g_base + i + 1, run_id, qids[q], s, k, n, r) for i, (q, s, k, n, r) in enumerate(sim.groups)))
        r_base = w.max_id("replays")
        w.write("replays", [("id", "int8"), ("run_id", "varchar"), ("trajectory_id", "int8"), ("question_id", "int4"),
                            ("step", "int4"), ("entropy", "float8")],
                ((r_base + i + 1, run_id, base + t + 1, qids[q], s, e) for i, (t, q, s, e) in enumerate(sim.replays)))
        w.write("step_metrics", [("run_id", "varchar"), ("step", "int4"), ("key", "varchar"), ("value", "float8")],
                ((run_id, s, k, v) for s, k, v in sim.metrics))
        for table in ("trajectories", "group_results", "replays"):
            w.fix_sequence(table)
        _write_states(conn, w, run_id, sim, qids)
    if store.engine.dialect.name == "postgresql":  # what autovacuum would do after a bulk load
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


def _write_states(conn, w: Writer, run_id: str, sim: Sim, qids: list[int]) -> None:
    """Replace the run's question states (registered empty) by the simulated ones. Pool slots are
    numbered per bucket in uid order, as migration 0005 numbers an existing run; the slot undo log
    starts after the last simulated step."""
    from sqlalchemy import delete, update

    from exgrpo_core.store.tables import QuestionState, Run
    conn.execute(delete(QuestionState).where(QuestionState.run_id == run_id))
    cols = [("run_id", "varchar"), ("question_id", "int4"), ("uid", "varchar"), ("latest_k", "int4"),
            ("n_groups", "int4"), ("last_step", "int4"), ("retired", "bool"), ("retired_step", "int4"),
            ("times_replayed", "int4"), ("pool_size", "int4"), ("slot", "int4")]

    def opt(x: int) -> int | None:
        return None if x < 0 else int(x)

    buckets: dict[int, list[tuple[str, int]]] = {}
    for i in range(sim.n_questions):
        if sim.pool[i] and sim.q_retired_step[i] < 0:
            buckets.setdefault(int(sim.q_latest[i]), []).append((f"synth-{i}", i))
    slot = {i: j for members in buckets.values() for j, (_, i) in enumerate(sorted(members))}
    w.write("question_states", cols, (
        (run_id, qids[i], f"synth-{i}", opt(sim.q_latest[i]), int(sim.q_groups[i]), opt(sim.q_last[i]),
         bool(sim.q_retired_step[i] >= 0), opt(sim.q_retired_step[i]), int(sim.q_replayed[i]), len(sim.pool[i]),
         slot.get(i)) for i in range(sim.n_questions)))
    last_step = max(s for _, s, *_ in sim.groups)
    conn.execute(update(Run).where(Run.id == run_id).values(slots_logged_after=last_step))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="database URL (sqlite:///... or postgresql+psycopg://...)")
    ap.add_argument("--n", type=int, default=100_000, help="trajectories to store")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--response-tokens", type=int, default=256, help="maximum response length (paper: 8192)")
    ap.add_argument("--run-name", default="synthetic")
    args = ap.parse_args()
    t0 = time.perf_counter()
    run_id = fill(args.url, args.n, seed=args.seed, group_size=args.group_size,
                  response_tokens=args.response_tokens, run_name=args.run_name)
    print(f"run {run_id}: {args.n} trajectories in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
