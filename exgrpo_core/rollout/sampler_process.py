"""`rollout.overlap_sampler=process`: the transformers engine's overlap sampler in a process of its own.

The child (multiprocessing spawn, daemonic, dying with the trainer through `run/lifeline.py`) holds a copy of
the engine whose model's parameters and buffers live in shared memory (CPU: `share_memory_`; CUDA: IPC
handles of the same tensors). At each `start` the child is idle: the trainer copies its current weights into
the shared tensors, bumps the weight version and sends the request (prompts, counts, seed, sampling settings)
over a pipe. The child first answers with float64 checksums of every tensor it holds (`rollout/sync.py`'s
`checksum`), which must equal the trainer's (else `EngineSyncError`, one line, when the batch is taken),
then samples with its own torch.Generator seeded with the request's seed (`decode._THREAD.generator`, as the
thread sampler does) and sends the Generations back. A child that dies is one error naming its pid and exit
code, never a hang.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any

import torch

from exgrpo_core.rollout import decode
from exgrpo_core.rollout.static_decode import InferenceCopy, StaticDecoder
from exgrpo_core.rollout.sync import EngineSyncError, checksum, compare_checksums
from exgrpo_core.run import lifeline


class SamplerProcessError(RuntimeError):
    """The overlap sampler process died or failed."""


@dataclass
class Request:
    """One batch for the child: what `TransformersEngine.generate` takes, the seed and the weight version."""

    version: int
    prompts: list
    counts: list
    seed: int
    kw: dict


def tensors(model) -> dict[str, torch.Tensor]:
    """The tensors the copy holds and the trainer's weights fill: parameters and buffers by name."""
    return {**dict(model.named_buffers()), **dict(model.named_parameters())}


def checksums(model) -> dict[str, float]:
    """float64 sum of every tensor of `model` as held (the push check's checksum, here on every tensor)."""
    return {n: checksum(t, t.dtype) for n, t in tensors(model).items()}


def _serve(conn, engine, parent: int, kernel: bool, threads: int) -> None:
    """The child's loop: for each Request, send ("sums", checksums) then ("gens", groups) or ("error", text);
    ends on None or a closed pipe."""
    lifeline.die_with_parent(parent, kernel=kernel)
    torch.set_num_threads(threads)
    device = next(engine.model.parameters()).device
    version = None
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        try:
            with torch.no_grad():
                conn.send(("sums", checksums(engine.model)))
            if req.version != version:  # the trainer wrote new weights: the static decoder's copy is stale
                engine.inference.version, version = None, req.version
            decode._THREAD.generator = torch.Generator(device=device).manual_seed(req.seed)
            conn.send(("gens", engine.generate(req.prompts, req.counts, **req.kw)))
        except BaseException as e:  # noqa: BLE001 - sent to the trainer as one line, the traceback to stderr
            traceback.print_exc()
            conn.send(("error", f"{type(e).__name__}: {e}".splitlines()[0]))
        finally:
            decode._THREAD.generator = None


class ProcessSampler:
    """The transformers engine's background sampler in a child process (module docstring)."""

    def __init__(self, engine, prefetch, ctx=None):
        """`prefetch`: the job class `start` returns (overlap.Prefetch: plan, version, gens, error, thread)."""
        ctx = ctx or mp.get_context("spawn")
        self.prefetch = prefetch
        child_engine = copy.copy(engine)
        child_engine.model = copy.deepcopy(engine.model).eval().requires_grad_(False)
        child_engine.model.share_memory()  # CPU tensors to shared memory (CUDA ones go by IPC handle)
        child_engine.inference, child_engine.static = InferenceCopy(), StaticDecoder()
        self.engine, self.model = child_engine, child_engine.model  # this side's view of the shared tensors
        self.shared = tensors(self.model)
        self.device = next(self.model.parameters()).device
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, child_engine, mp.current_process().pid, True,
                                                     torch.get_num_threads()),
                                name="exgrpo-overlap-sampler", daemon=True)
        lifeline.start_tied(self.proc)  # from a thread as long-lived as this process: PR_SET_PDEATHSIG applies
        child.close()  # the child's end lives in the child only: its death closes the pipe
        self.version = 0  # weight versions written into the shared tensors
        self.busy = False

    @torch.no_grad()
    def load(self, trainer_model) -> dict[str, float]:
        """Copy the trainer's weights into the shared tensors (the child is idle) and bump the version;
        the trainer's checksums of what was copied."""
        theirs = tensors(trainer_model)
        if theirs.keys() != self.shared.keys():
            raise EngineSyncError(f"overlap sampler process: tensors differ from the trainer's "
                                  f"({sorted(theirs.keys() ^ self.shared.keys())[:3]})")
        sums = {}
        for name, t in theirs.items():
            self.shared[name].copy_(t.detach())
            sums[name] = checksum(t, self.shared[name].dtype)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # written before the child reads
        self.version += 1
        return sums

    def died(self) -> SamplerProcessError:
        self.proc.join(timeout=5)
        return SamplerProcessError(f"the overlap sampler process (pid {self.proc.pid}) died (exit code "
                                   f"{self.proc.exitcode}); stopping the run")

    def receive(self, what: str):
        """The child's next message, which must be `what`; its death or failure raises one clear error."""
        ready = wait_any([self.conn, self.proc.sentinel])  # a message, a closed pipe, or the child's end
        try:
            if self.conn not in ready:
                raise EOFError
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise self.died() from None
        if kind == "error":
            raise SamplerProcessError(f"the overlap sampler process (pid {self.proc.pid}) failed: {value} "
                                      "(its traceback is on stderr)")
        if kind != what:
            raise SamplerProcessError(f"the overlap sampler process sent {kind!r}, expected {what!r}")
        return value

    def start(self, trainer_model, plan, version: int, prompts, counts, seed: int, **kw):
        """Load the trainer's current weights into the child and let it sample `prompts`; the child's checksums
        are compared with the trainer's as they arrive (before the batch can be taken: `wait` raises
        EngineSyncError on a mismatch), so the trainer does not wait for the child here."""
        if self.busy:
            raise SamplerProcessError("overlap sampler process: a batch is still in flight (take or wait first)")
        if not self.proc.is_alive():
            raise self.died()
        mine = self.load(trainer_model)
        try:
            self.conn.send(Request(self.version, list(prompts), list(counts), int(seed), dict(kw)))
        except OSError:  # BrokenPipeError: it died since
            raise self.died() from None
        self.busy = True
        job = self.prefetch(plan, version)
        job.stop = self.proc.kill  # a child past rollout.overlap_timeout_s: its receiving thread then ends

        def work() -> None:
            try:
                bad = compare_checksums(mine, self.receive("sums"), rel=0.0)
                if bad:
                    self.proc.kill()  # it samples from weights that are not the trainer's
                    raise EngineSyncError(f"overlap sampler process: weights differ from the trainer's after the "
                                          f"copy ({len(bad)} of {len(mine)} tensors, e.g. {bad[0]}); stopping "
                                          "before training on samples of stale weights")
                job.gens = self.receive("gens")
            except BaseException as e:  # handed to the trainer's thread by `wait`
                job.error = e
            finally:
                self.busy = False

        job.thread = threading.Thread(target=work, name="exgrpo-overlap-receive", daemon=True)
        job.thread.start()
        return job

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (after the batch in flight: callers wait first); killed if it does not end."""
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout=timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=timeout_s)
        self.conn.close()
