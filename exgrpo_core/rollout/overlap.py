"""`rollout.overlap = N`: the fresh rollouts of steps up to t+N are sampled while step t trains.

After step t's buffer update and trajectory selection, `start_next` plans step t+1's batch and samples it in a
background thread, on a copy of the policy holding the weights step t started with (torch ops release the
GIL), with its own random stream seeded from the run's rng; step t trains meanwhile and step t+1 takes the
rollouts (`take`). The copy's weights are the policy version the rollouts record (`Rollout.step`, the
database's step column: the step whose starting weights sampled them). A batch older than
`rollout.max_staleness` steps is dropped, counted and sampled again. Checkpoints wait for the batches in flight
and store them (`state`), so a resumed run trains on the rollouts the uninterrupted run did. With N > 1 the
thread sampler takes the batches in turn, each on a snapshot of the weights its planning step started with.
On the remote engine the rollout server is the sampler (`ServerSampler`): step t+1's requests go to it while
step t trains, and step t's push waits for them first (`wait`), since the push pauses the server and changes
its weights; each output must carry the weight version the batch was sent under.
`rollout.overlap_sampler=process` runs the transformers engine's sampler in a child process instead of the
thread (`rollout/sampler_process.py`: weights copied into shared memory at each start and checked).
One training process (the transformers copy is not sharded; run/start_checks.py refuses more); colocated
vLLM stays synchronous.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from exgrpo_core.rollout import decode
from exgrpo_core.rollout.static_decode import InferenceCopy, StaticDecoder
from exgrpo_core.types import BatchPlan, Generation


class OverlapTimeout(RuntimeError):
    """A batch sampled ahead did not arrive within `rollout.overlap_timeout_s`."""


@dataclass
class Prefetch:
    """A batch sampled ahead: its plan, the policy version that samples it, and (once done) its groups.
    `timeout_s`: the longest `finish` waits (None: no limit); `stop`: what stops a sampler that ran past it."""

    plan: object
    version: int
    gens: list[list[Generation]] | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = field(default=None, repr=False)
    timeout_s: float | None = None
    stop: Callable[[], None] | None = field(default=None, repr=False)

    def finish(self) -> None:
        """Let the batch finish (its groups or error kept); past `timeout_s` the sampler is stopped and the
        error is OverlapTimeout, raised now and by every later `wait`."""
        if self.thread is None:
            return
        self.thread.join(self.timeout_s)
        if self.thread.is_alive():
            if self.stop is not None:
                self.stop()
            step = getattr(self.plan, "step", None)
            self.error = OverlapTimeout(
                f"the overlap sampler gave no batch{'' if step is None else f' for step {step}'} within "
                f"{self.timeout_s:g} s (rollout.overlap_timeout_s); stopping the run (rerun the same command to "
                "resume from the last checkpoint)")
        self.thread = None  # a sampler thread that hangs is left behind (daemonic)
        if isinstance(self.error, OverlapTimeout):
            raise self.error

    def wait(self) -> list[list[Generation]]:
        self.finish()
        if self.error is not None:
            raise self.error
        return self.gens


@dataclass
class Ahead:
    """The session's overlap state: the sampler (made at the first overlapped step) and the batches in flight,
    in step order."""

    sampler: Sampler | None = None
    jobs: list[Prefetch] = field(default_factory=list)

    @property
    def job(self) -> Prefetch | None:
        """The next batch to be trained on."""
        return self.jobs[0] if self.jobs else None


class Sampler:
    """The transformers engine's background sampler: a copy of the trainer's engine on its own copy of the model."""

    def __init__(self, engine):
        self.engine = copy.copy(engine)
        self.engine.model = copy.deepcopy(engine.model)
        self.engine.inference, self.engine.static = InferenceCopy(), StaticDecoder()
        self.last: threading.Thread | None = None  # the thread of the batch started last

    def start(self, trainer_model, plan, version: int, prompts, counts, seed: int, **kw) -> Prefetch:
        """Load the trainer's current weights, then sample `prompts` in a thread; while an earlier batch is still
        sampling (overlap > 1), the thread waits for it, then loads a snapshot of the weights taken now."""
        before = self.last if self.last is not None and self.last.is_alive() else None
        snapshot = None
        with torch.no_grad():
            if before is None:
                self.engine.model.load_state_dict(trainer_model.state_dict())
            else:
                snapshot = {k: v.detach().clone() for k, v in trainer_model.state_dict().items()}
        job = Prefetch(plan, version)
        device = next(self.engine.model.parameters()).device

        def work() -> None:
            if before is not None:
                before.join()
                with torch.no_grad():
                    self.engine.model.load_state_dict(snapshot)
            decode._THREAD.generator = torch.Generator(device=device).manual_seed(seed)
            try:
                job.gens = self.engine.generate(prompts, counts, **kw)
            except BaseException as e:  # handed to the trainer's thread by `wait`
                job.error = e
            finally:
                decode._THREAD.generator = None

        job.thread = self.last = threading.Thread(target=work, name="exgrpo-overlap-sampler", daemon=True)
        job.thread.start()
        return job

    def close(self) -> None:
        pass


class ServerSampler:
    """The remote engine's background sampler: the rollout server itself, which holds the weights step t started
    with (pushed after step t-1) until step t's push; sampling is seeded on the server."""

    def __init__(self, engine):
        self.engine = engine

    def start(self, trainer_model, plan, version: int, prompts, counts, seed: int, **kw) -> Prefetch:
        """Send `prompts` to the server from a thread; every output must carry the server's current weight version."""
        job, label = Prefetch(plan, version), self.engine.version

        def work() -> None:
            try:
                job.gens = self.engine.generate(prompts, counts, expect_version=label, **kw)
            except BaseException as e:  # handed to the trainer's thread by `wait`
                job.error = e

        job.thread = threading.Thread(target=work, name="exgrpo-overlap-requests", daemon=True)
        job.thread.start()
        return job

    def close(self) -> None:
        pass


def make_sampler(engine, kind: str = "thread"):
    """The sampler of step t+1's batch: the server for the remote engine, else a copy of the engine in a
    thread or (`kind="process"`, `rollout.overlap_sampler`) in a child process."""
    if getattr(engine, "shared_by_processes", False):
        return ServerSampler(engine)
    if kind == "process":
        from exgrpo_core.rollout.sampler_process import ProcessSampler

        return ProcessSampler(engine, Prefetch)
    return Sampler(engine)


def state(ahead: Ahead | None) -> dict | None:
    """The batches in flight as plain data for the checkpoint (waits for them)."""
    if ahead is None or not ahead.jobs:
        return None
    return {"jobs": [{"plan": asdict(job.plan), "version": job.version,
                      "gens": [[asdict(g) for g in gs] for gs in job.wait()]} for job in ahead.jobs]}


def from_state(data: dict | None) -> Ahead | None:
    """The checkpointed batches in flight, finished (a checkpoint of overlap 1 from before N > 1 holds one)."""
    if not data:
        return None
    jobs = [Prefetch(BatchPlan(**j["plan"]), j["version"], [[Generation(**g) for g in gs] for gs in j["gens"]])
            for j in data.get("jobs", [data])]
    return Ahead(jobs=jobs)


def _job(s, step: int) -> Prefetch | None:
    jobs = s.ahead.jobs if s.ahead is not None else []
    return next((j for j in jobs if j.plan.step == step), None)


def planned(s):
    """The plan of step s.step when it was planned and sampled ahead, else None."""
    job = _job(s, s.step)
    return job.plan if job is not None else None


def wait(s) -> None:
    """Let the batches in flight finish (their results are kept; past rollout.overlap_timeout_s, OverlapTimeout)."""
    for job in s.ahead.jobs if s.ahead is not None else []:
        job.finish()


def bound(cfg) -> int:
    """The oldest a fresh batch may be, in steps (`rollout.max_staleness`, default `rollout.overlap`)."""
    return cfg.overlap if cfg.max_staleness is None else cfg.max_staleness


def take(s, plan) -> tuple[list[list[Generation]] | None, int, int]:
    """The groups sampled ahead for `plan` (None: sample now), the policy version that sampled them, and
    1 when a batch older than the bound was dropped (its plan is sampled again, now)."""
    job = _job(s, plan.step)
    if job is None:
        return None, plan.step, 0
    s.ahead.jobs.remove(job)
    gens = job.wait()
    if plan.step - job.version > bound(s.cfg.rollout):
        return None, plan.step, 1
    return gens, job.version, 0


def start_next(s, plan_batch) -> None:
    """Plan the steps after s.step up to s.step + N (rollout.overlap) that are not planned yet, and start
    sampling each from the current weights (the ones step s.step started with); none past the run's last step."""
    cfg = s.cfg
    if not cfg.rollout.overlap:
        return
    planned_up_to = max([s.step] + [j.plan.step for j in (s.ahead.jobs if s.ahead is not None else [])])
    for step in range(planned_up_to + 1, min(s.step + cfg.rollout.overlap, cfg.run.steps - 1) + 1):
        _start(s, plan_batch, step)


def _close(s, sampler) -> None:
    """Let the batches in flight finish, then stop the sampler; one past its timeout is the run's error already."""
    try:
        wait(s)
    except OverlapTimeout:
        pass
    finally:
        sampler.close()


def _start(s, plan_batch, step: int) -> None:
    """Plan `step` (as if it had begun) and start sampling it from the current weights."""
    cfg = s.cfg
    if s.ahead is None or s.ahead.sampler is None:
        s.ahead = s.ahead or Ahead()
        s.ahead.sampler = sampler = make_sampler(s.engine, cfg.rollout.overlap_sampler)
        s._closers.append(lambda: _close(s, sampler))  # no sampler thread or process outlives the session
    now, s.step = s.step, step
    try:
        plan = plan_batch(s)
    finally:
        s.step = now
    K = cfg.rollout.group_size
    uids = plan.fresh + plan.replay
    counts = [K] * len(plan.fresh) + [K - (cfg.buffer.replay_mode == "trajectory")] * len(plan.replay)
    job = s.ahead.sampler.start(
        getattr(s.engine, "model", None), plan, s.step, [s.prompt_ids(u) for u in uids], counts, s.rng.getrandbits(63),
        temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_response_tokens)
    job.timeout_s = cfg.rollout.overlap_timeout_s
    s.ahead.jobs.append(job)
