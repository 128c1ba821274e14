"""Children of a comparison or a sweep as parallel flow runs of the `exgrpo-train` deployment.

The parent (the compare flow with `parallel=True`, or the sweep flow) submits every child with
`run_deployment(..., timeout=0)` to one work queue of the deployment's work pool, tagged with the
parent's name and the child's run name, then polls the children's states until all have ended. The
queue's concurrency limit (`slots`: one per GPU of the pool) is how many children run at once; Prefect's
workers enforce it. A rerun of the parent finds its children by tag instead of resubmitting them (the
idempotency key makes a duplicate submission return the existing run); `retry_failed` resubmits only
the children whose latest run failed, crashed or was cancelled. Children the experience database
already holds as finished (whichever mode trained them) are read back, never submitted; a child flow
run that ends AlreadyFinished counts as finished. Finished children are read back from the
experience database, which the children and the parent must share (PostgreSQL across machines). A
report with unfinished children never replaces one built from finished children only (`report_dir`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from exgrpo_core.config.redact import hide_overrides
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url
from flows.compare import report

DEPLOYMENT = "exgrpo-train/exgrpo-train"
QUEUE = "exgrpo-children"
PARENT_TAG, CHILD_TAG = "exgrpo-parent:", "exgrpo-child:"
STATUS = {"COMPLETED": "finished", "FAILED": "failed", "CRASHED": "crashed", "CANCELLED": "cancelled"}
RETRY = {"failed", "crashed", "cancelled"}
POLL_S = 5.0
ORIGINS = {"flow run": "ran as flow runs of the deployment `{deployment}` (work queue `{queue}`)",
           "earlier flow run": "{were} read back from the experience database, trained by flow runs of an earlier "
                               "run of this parallel {kind}",
           "database": "{were} read back from the experience database, trained before outside the deployment (a "
                       "sequential {kind} or a training run of the same name): not submitted"}
"""Where a parallel report's children came from (a result row's `origin`), as the report's note says it."""


class ParallelError(RuntimeError):
    """The children cannot be submitted as asked (no server, no deployment, another pool); one line says why."""


class ChildrenFailedError(RuntimeError):
    """Some children failed, crashed or were cancelled; the report was written with them marked."""


@dataclass
class Child:
    """One child training run: its row label (arm or grid point), seed, config and the overrides that
    made the config from the preset (sent as the deployment's parameters)."""

    label: str
    seed: int
    cfg: ExGRPOConfig
    overrides: list[str]
    paper_id_avg: float | None = None
    target_weights: dict[int, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.cfg.run.name


@dataclass
class Target:
    """Where children run: a deployment, its work pool (checked when named), a queue of that pool and
    the queue's concurrency limit (None: leave it as it is)."""

    deployment: str = DEPLOYMENT
    pool: str | None = None
    queue: str = QUEUE
    slots: int | None = None
    retry_failed: bool = False


def check_args(slots: int | None, queue: str) -> None:
    """User errors found before anything starts: the server must be a real one (workers need it)."""
    if not os.environ.get("PREFECT_API_URL"):
        raise ParallelError("parallel children run on a Prefect server's workers: set PREFECT_API_URL "
                            "(infra/services.sh up; eval \"$(infra/services.sh env)\"; see docs/scaling.md)")
    if slots is not None and slots < 1:
        raise ParallelError(f"--slots must be at least 1 (got {slots})")
    if not queue.strip():
        raise ParallelError("--work-queue must name a queue")


def cli_args(target: Target) -> list[str]:
    """The command-line options that name this target (for the report's command line)."""
    return ["--parallel", *(["--pool", target.pool] if target.pool else []), "--work-queue", target.queue,
            *(["--slots", str(target.slots)] if target.slots else []),
            *(["--deployment", target.deployment] if target.deployment != DEPLOYMENT else [])]


def run_children(children: list[Child], target: Target, parent: str, preset: str,
                 mlflow_parent: str | None, poll_s: float = POLL_S) -> list[dict]:
    """Submit the children not yet submitted (and, with retry_failed, those that did not finish), wait
    until every child's latest flow run has ended, and return one report result per child, in order.
    Call `prepare(target)` first."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        pool = client.read_deployment_by_name(target.deployment).work_pool_name
        done = {c.name for c in children if finished_summary(c.cfg)}  # trained already, in either mode
        found = find_children(client, parent)
        todo = [c for c in children if c.name not in done]
        new = [c for c in todo if not found.get(c.name) or
               (target.retry_failed and status(found[c.name][-1]) in RETRY)]
        print(f"{parent}: {len(children)} children on pool {pool}, queue {target.queue} (limit "
              f"{target.slots or 'as set'}): {sum(c.name in found or c.name in done for c in children)} found "
              f"({len(done)} finished in the database), {len(new)} to submit")
        for c in new:
            submit(c, target, parent, preset, mlflow_parent, attempt=len(found.get(c.name, [])))
        runs = wait(client, todo, parent, poll_s) if todo else {}
    results = [collect(c, "finished" if c.name in done else status(runs[c.name])) for c in children]
    for c, r in zip(children, results):
        r["row"]["origin"] = ("flow run" if c.name not in done else "earlier flow run" if c.name in found
                              else "database")
    return results


def note(results: list[dict], target: Target, kind: str = "comparison") -> str:
    """The report's sentence on where the children came from: how many ran as flow runs of the deployment
    now, and how many were read back, trained earlier (by this parallel comparison's flow runs, or outside
    the deployment, e.g. a sequential comparison of the same name)."""
    counts = {o: sum(r["row"].get("origin", "flow run") == o for r in results) for o in ORIGINS}
    parts = [f"{n} of {len(results)} {'child' if len(results) == 1 else 'children'} "
             + ORIGINS[o].format(deployment=target.deployment, queue=target.queue, kind=kind,
                                 were="was" if n == 1 else "were")
             for o, n in counts.items() if n]
    return ("Parallel: " + "; ".join(parts) + ". `status` is what became of each child's latest run. Children that "
            "did not finish are left out of the means, statistics and plots; `--retry-failed` resubmits only them.")


def finished_summary(cfg: ExGRPOConfig) -> dict | None:
    """A child run that already finished all its steps (status `finished`): the summary a report needs,
    read from its database without opening a training session; None when it must (still) train."""
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    if not run_dir.is_dir():  # not trained here (a child on another machine: its flow run says AlreadyFinished)
        return None
    store = ExperienceStore(resolve_db_url(cfg.run.db_url, run_dir))
    try:
        run_id = store.find_run_by_name(cfg.run.name)
        row = store.get_run(run_id) if run_id else None
    finally:
        store.close()
    if not row or row["status"] != "finished" or row["step"] < cfg.run.steps - 1:
        return None
    return {"run_id": run_id, "run_dir": str(run_dir), "mlflow_run_id": row["mlflow_run_id"]}


def prepare(target: Target) -> str:
    """Check the arguments, the deployment (and its pool); create the queue in that pool when missing and
    set its limit. Returns the pool's name. User errors are a ParallelError before any child exists."""
    from prefect import get_client

    check_args(target.slots, target.queue)
    with get_client(sync_client=True) as client:
        return _prepare(client, target)


def _prepare(client, target: Target) -> str:
    import httpx
    from prefect.exceptions import ObjectNotFound

    url = os.environ.get("PREFECT_API_URL")
    try:
        dep = client.read_deployment_by_name(target.deployment)
    except ObjectNotFound:
        raise ParallelError(f"no deployment {target.deployment} on the Prefect server {url}: deploy it from the "
                            "repository with `prefect deploy --name exgrpo-train --pool POOL`") from None
    except httpx.HTTPError as e:
        raise ParallelError(f"Prefect server {url} does not answer ({e}); infra/services.sh status") from None
    if target.pool and dep.work_pool_name != target.pool:
        raise ParallelError(f"deployment {target.deployment} runs on work pool {dep.work_pool_name}, not "
                            f"{target.pool}: `prefect deploy --name exgrpo-train --pool {target.pool}`, or drop --pool")
    try:
        queue = client.read_work_queue_by_name(target.queue, work_pool_name=dep.work_pool_name)
    except ObjectNotFound:
        client.create_work_queue(target.queue, work_pool_name=dep.work_pool_name, concurrency_limit=target.slots,
                                 description="exgrpo parallel children (one slot per GPU)")
    else:
        if target.slots is not None and queue.concurrency_limit != target.slots:
            client.update_work_queue(queue.id, concurrency_limit=target.slots)
    return dep.work_pool_name


def find_children(client, parent: str) -> dict[str, list]:
    """{child run name: its flow runs, oldest first} of every flow run tagged with this parent."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    runs, page = [], 200
    while True:
        got = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[PARENT_TAG + parent])),
                                    limit=page, offset=len(runs))
        runs += got
        if len(got) < page:
            break
    out: dict[str, list] = {}
    for fr in sorted(runs, key=lambda r: r.created):
        for tag in fr.tags:
            if tag.startswith(CHILD_TAG):
                out.setdefault(tag[len(CHILD_TAG):], []).append(fr)
    return out


def submit(child: Child, target: Target, parent: str, preset: str, mlflow_parent: str | None, attempt: int):
    """One flow run of the deployment for this child, returned at once (`timeout=0`). Credentials go masked
    (`user:***@`): the child fills them in from its worker's environment (EXGRPO_DB_URL, the pass file)."""
    from prefect.deployments import run_deployment

    fr = run_deployment(target.deployment, timeout=0, work_queue_name=target.queue,
                        parameters={"preset": preset, "overrides": hide_overrides(child.overrides),
                                    "parent_mlflow_run_id": mlflow_parent},
                        flow_run_name=child.name + (f"-retry{attempt}" if attempt else ""),
                        tags=[PARENT_TAG + parent, CHILD_TAG + child.name, f"exgrpo-arm:{child.label}",
                              f"exgrpo-seed:{child.seed}"],
                        idempotency_key=f"{parent}/{child.name}/{attempt}")
    print(f"submitted {child.name} (flow run {fr.name}{', retry ' + str(attempt) if attempt else ''})")
    return fr


def status(flow_run) -> str:
    """finished / failed / crashed / cancelled once ended, else the state in lower case (scheduled, running...)."""
    kind = flow_run.state_type.value if flow_run.state_type else "SCHEDULED"
    if kind == "CANCELLED" and flow_run.state_name == "AlreadyFinished":  # trained by an earlier run
        return "finished"
    return STATUS.get(kind, kind.lower())


def wait(client, children: list[Child], parent: str, poll_s: float) -> dict:
    """Poll until every child's latest flow run has ended; print each change. Returns {name: flow run}."""
    seen: dict[str, str] = {}
    while True:
        found = find_children(client, parent)
        missing = [c.name for c in children if not found.get(c.name)]
        if missing:  # deleted in the UI while we waited
            raise ParallelError(f"flow runs of {missing} are gone from the Prefect server; rerun to resubmit them")
        latest = {c.name: found[c.name][-1] for c in children}
        for name, fr in latest.items():
            if seen.get(name) != status(fr):
                seen[name] = status(fr)
                print(f"{name}: {seen[name]}")
        if all(s in STATUS.values() for s in seen.values()):
            return latest
        time.sleep(poll_s)


def collect(child: Child, state: str) -> dict:
    """A report result: a finished child read back from the experience database, otherwise a row that
    says what became of it."""
    if state != "finished":
        return placeholder(child, state)
    run_dir = Path(child.cfg.run.output_dir).resolve() / child.name
    url = resolve_db_url(child.cfg.run.db_url, run_dir)
    if url.startswith("sqlite") and not run_dir.is_dir() and not child.cfg.run.db_url:
        return placeholder(child, "finished elsewhere (per-run SQLite: share a database)")
    store = ExperienceStore(url)
    try:
        run_id = store.find_run_by_name(child.name)
        if run_id is None:
            return placeholder(child, "finished, not in the database")
        out = report.arm_result(store, run_id, child.label, child.seed,
                                child.cfg.train.batch_size * child.cfg.rollout.group_size, child.paper_id_avg,
                                eval_dir=run_dir / "eval", target_weights=child.target_weights)
        out["row"]["mlflow_run_id"] = (store.get_run(run_id) or {}).get("mlflow_run_id")
    finally:
        store.close()
    out["row"]["status"] = "finished"
    return out


def placeholder(child: Child, state: str) -> dict:
    """The row of a child with no results to read: its status, every number empty."""
    row = {"arm": child.label, "seed": child.seed, "status": state, "run_id": "", "heldout": {},
           "heldout_avg": math.nan, "paper_id_avg": child.paper_id_avg, "replay_buckets": {},
           "slots_per_step": child.cfg.train.batch_size * child.cfg.rollout.group_size}
    return {"row": row, "curves": {}, "slot_trace": [], "questions": {}}


def report_dir(results: list[dict], out_dir: Path, name: str, prefix: str = "compare") -> Path:
    """Where a report of these results goes: `out_dir`, unless some child did not finish while `out_dir`
    already holds a report whose children all finished; that report stays, this one goes to
    `out_dir/incomplete`."""
    if all(r["row"].get("status", "finished") == "finished" for r in results):
        return out_dir
    try:
        rows = json.loads((out_dir / f"{prefix}_{name}.json").read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return out_dir
    if rows and all(r.get("status", "finished") == "finished" for r in rows):
        return out_dir / "incomplete"
    return out_dir


def check_finished(results: list[dict], report_path: str, retry_hint: str = "--retry-failed") -> None:
    """Raise ChildrenFailedError naming the children that did not finish (after the report is written)."""
    bad = [f"{r['row']['arm']}/s{r['row']['seed']} {r['row']['status']}" for r in results
           if r["row"].get("status", "finished") != "finished"]
    if bad:
        raise ChildrenFailedError(f"{len(bad)} of {len(results)} children did not finish ({', '.join(bad)}); the "
                                  f"table marks them: {report_path}; rerun with {retry_hint} to resubmit only those")
