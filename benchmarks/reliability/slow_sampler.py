"""`exgrpo train` with a slowed overlap sampler, for the fault-injection harness (test use only).

    python benchmarks/reliability/slow_sampler.py DELAY_S train --config tiny --set rollout.overlap=1 ...

Runs `flows.cli` in this process after two monkeypatches, so a kill can land while a checkpoint waits for
the batch in flight (rollout.overlap=1, run.checkpoint_every=1): each checkpoint's wait for that batch
(`overlap.state`) first writes `in_flight_<step>` into the run folder (<step>: the step being checkpointed),
holding `alive` when the sampler thread is still running then, else `done`; the background sampler, before
each batch it samples ahead, waits until that checkpoint's wait has begun (at most 120 s), then sleeps
DELAY_S, so the batch is in flight whatever the machine's load. With rollout.overlap_sampler=process the child
cannot be patched from here: the trainer's thread receiving its batch (`ProcessSampler.receive` of "gens") waits
and sleeps the same way before taking it, so the batch is not yet received (the child may have sampled it).
Waiting and sleeping draw no random number: the run's results are those of the plain command. The library is
unchanged.
"""

from __future__ import annotations

import runpy
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def patch(delay_s: float, run_dir: Path) -> None:
    from exgrpo_core.rollout import overlap, sampler_process

    init, state, receive = overlap.Sampler.__init__, overlap.state, sampler_process.ProcessSampler.receive
    waiting = threading.Event()  # set when a checkpoint begins to wait for the batch in flight

    def slow_init(self, engine):
        init(self, engine)
        generate = self.engine.generate

        def slow_generate(*args, **kw):
            waiting.wait(timeout=120)
            waiting.clear()
            time.sleep(delay_s)
            return generate(*args, **kw)

        self.engine.generate = slow_generate  # the sampler's own engine copy, never the trainer's

    def slow_receive(self, what):
        if what == "gens":
            waiting.wait(timeout=120)
            waiting.clear()
            time.sleep(delay_s)
        return receive(self, what)

    def marked_state(ahead):
        job = ahead.job if ahead is not None else None
        if job is not None:
            alive = job.thread is not None and job.thread.is_alive()
            tmp = run_dir / f".in_flight_{job.plan.step - 1}"
            tmp.write_text("alive" if alive else "done")
            tmp.rename(run_dir / tmp.name[1:])  # whole when the harness sees it
            waiting.set()
        return state(ahead)

    overlap.Sampler.__init__, overlap.state = slow_init, marked_state
    sampler_process.ProcessSampler.receive = slow_receive


def _run_dir(argv: list[str]) -> Path:
    sets = dict(a.split("=", 1) for a in argv if "=" in a and a.startswith("run."))
    return Path(sets["run.output_dir"]).resolve() / sets["run.name"]


if __name__ == "__main__":
    delay, cli_args = float(sys.argv[1]), sys.argv[2:]
    patch(delay, _run_dir(cli_args))
    sys.argv = ["flows.cli", *cli_args]
    runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
