"""The model's work in one or several processes: sampling, scoring and the optimiser step.

`Worker` holds what every process holds (model, optimiser, rollout engine) and computes its share
of one operation. `Team` is rank 0's handle: with one process it calls the worker directly; with
several it first broadcasts the operation and its inputs, every process computes its shard, and the
results are gathered on rank 0 in order. Followers sit in `serve` until rank 0 sends `stop`.

  generate  prompts split in contiguous shards, one per rollout engine (a vLLM tensor-parallel group
            of ranks shares one: same share, same seed); each samples with seed + shard index (seed
            drawn from rank 0's torch RNG, so a resumed run samples what an uninterrupted one would)
  score     rollouts split in contiguous shards (trainer log-probs and H(o), no gradient)
  optimise  every rank gets the whole batch, takes a share of each mini-batch's rows, gradients are
            summed over processes before each optimiser step (optimise.py), stats reduced
Only rank 0 touches the database, MLflow and Prefect (docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from exgrpo_core import metrics as M
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.engine import sample_counts
from exgrpo_core.run import checkpoint
from exgrpo_core.training import distributed as D, fsdp, policy
from exgrpo_core.training.batch import collate
from exgrpo_core.training.optimise import optimise
from exgrpo_core.types import Generation, Rollout


class TeamError(RuntimeError):
    """A follower got an operation it does not know, or the processes' weights drifted apart."""


@dataclass
class Worker:
    model: torch.nn.Module          # as prepared by Accelerate (training forward passes)
    optimizer: torch.optim.Optimizer
    accelerator: object
    engine: object                  # rollout engine over the unwrapped model
    ref_model: torch.nn.Module | None
    scoring_micro_batch: int
    temperature: float
    sharded: bool = False           # FSDP2: every forward is a collective
    share_prompts: bool = True      # train.share_prompt_forward

    @property
    def topo(self) -> D.Topology:
        return D.topology()

    def _share(self, items: list, index: int | None = None, shards: int | None = None,
               pad: bool | None = None) -> tuple[list, int]:
        """Share `index` of `shards` contiguous shares (default: this rank's of world) and its real
        length; padded (with copies) to the largest share when `pad` (default: FSDP2), so every
        process runs the same number of forward passes."""
        index = self.topo.rank if index is None else index
        shards = self.topo.world if shards is None else shards
        mine = D.shard(items, index, shards)
        real = len(mine)
        if (self.sharded if pad is None else pad) and items:
            mine += [(mine or items)[0]] * (-(-len(items) // shards) - real)
        return mine, real

    def generate(self, args) -> list[list[Generation]]:
        """This process's share of the prompts, sampled. Processes that share one engine (a vLLM
        tensor-parallel group of `engine.group_size` ranks) get the same share and seed, and the
        group's first rank alone returns the samples."""
        prompts, n, kwargs, seed, settings = args
        group = getattr(self.engine, "group_size", 1)
        index = self.topo.rank // group
        mine_counted, real = self._share(list(zip(prompts, sample_counts(prompts, n))), index,
                                         self.topo.world // group, pad=getattr(self.engine, "synced", False))
        mine, counts = [p for p, _ in mine_counted], [c for _, c in mine_counted]
        if seed is not None:
            torch.manual_seed(seed + index)
        settings = {k: v for k, v in settings.items() if k in self.engine.tunable}  # the rest is the engine's own
        saved = {k: getattr(self.engine, k) for k in settings}
        try:
            for k, v in settings.items():  # e.g. evaluation's top_p and batch size
                setattr(self.engine, k, v)
            out = self.engine.generate(mine, counts, **kwargs)[:real] if mine else []
        finally:
            for k, v in saved.items():
                setattr(self.engine, k, v)
        return out if self.topo.rank % group == 0 else []

    @torch.no_grad()
    def score(self, args) -> list[tuple[list[float], float]]:
        """(response log-probs, H(o) or NLL) of this rank's share of the rollouts (docs/implementation_details.md)."""
        rollouts, entropy_kind = args
        mine, real = self._share(rollouts)
        if not mine:
            return []
        model = self.accelerator.unwrap_model(self.model)
        batch = collate(mine, [0.0] * len(mine), self.engine.pad_id)
        was_training = model.training
        model.eval()
        dev = self.accelerator.device
        logp, ent = policy.token_logprobs_and_entropy(
            model, batch.input_ids.to(dev), batch.attention_mask.to(dev), micro_batch_size=self.scoring_micro_batch,
            with_entropy=entropy_kind == "mean", temperature=self.temperature,
            score_mask=batch.response_mask, share_prompts=self.share_prompts)
        model.train(was_training)
        mask = batch.response_mask.to(logp.device)
        h = policy.trajectory_entropy(ent, mask) if entropy_kind == "mean" else policy.trajectory_nll(logp, mask)
        return [(logp[i][mask[i]].float().cpu().tolist(), float(h[i])) for i in range(real)]

    def optimise(self, args) -> dict[str, float]:
        batch, kwargs = args
        dev = self.accelerator.device
        for name in ("input_ids", "attention_mask", "response_mask", "advantages", "old_logprobs", "is_replay",
                     "tis_weights"):
            if getattr(batch, name) is not None:
                setattr(batch, name, getattr(batch, name).to(dev))
        stats = optimise(self.model, self.optimizer, self.accelerator, batch, ref_model=self.ref_model,
                         shard=(self.topo.rank, self.topo.world), sharded=self.sharded,
                         share_prompts=self.share_prompts, **kwargs)
        if self.topo.world > 1 and not self.sharded:  # FSDP2 shards differ by design
            stats[PARAM_GAP] = param_gap(self.accelerator.unwrap_model(self.model))
        return stats


    def push_weights(self, args) -> dict[str, float]:
        """Push this process's weights to its rollout engine and check them (engine_sync); an engine that
        all processes share (a rollout server) gets them from rank 0 only. With FSDP2 the whole
        tensors are gathered one at a time on every process as they are pushed. A failed check on any
        process stops all of them."""
        probe_ids, dtype = args  # probe_ids None: push only (when the session opens)
        model = self.accelerator.unwrap_model(self.model)
        named = fsdp.full_parameters(model) if self.sharded else model.named_parameters()
        trainer_logps = None
        if self.sharded and probe_ids is not None:  # a forward: a collective, so before any push
            trainer_logps = engine_sync.trainer_probe(model, probe_ids)
        pushes = self.topo.is_main or not getattr(self.engine, "shared_by_processes", False)
        stats, error = {}, ""
        if pushes and probe_ids is None:
            self.engine.push_weights(named)
        elif pushes:
            try:
                stats = engine_sync.push_and_check(self.engine, model, probe_ids, dtype, named=named,
                                                   trainer_logps=trainer_logps)
            except engine_sync.EngineSyncError as e:
                error = str(e)
        for _ in named:  # FSDP2: the gathers are collectives; every process walks every tensor
            pass
        if probe_ids is None:
            return stats
        if self.topo.world > 1:
            if D.all_reduce_max(1.0 if error else 0.0) and not error:
                error = "another training process's rollout engine failed its weight check"
            stats = {k: D.all_reduce_max(stats.get(k, 0.0)) for k in (M.ENGINE_SYNC_GAP, M.ENGINE_SYNC_S)}
        if error:
            raise engine_sync.EngineSyncError(error)
        return stats

    def model_state(self, args=None) -> dict | None:
        """FSDP2: the full model state dict, on rank 0 (None elsewhere)."""
        state = fsdp.full_model_state(self.model)
        return state if self.topo.is_main else None

    def save_model(self, folder: str) -> None:
        fsdp.save_model_shards(self.model, folder)

    def save_optimizer(self, folder: str) -> None:
        fsdp.save_optimizer_shards(self.model, self.optimizer, folder)

    def load_optimizer(self, ckpt: str) -> None:
        """The optimiser state of checkpoint folder `ckpt`: its shards (FSDP2) or the full state dict."""
        state = checkpoint.load_trainer_state(ckpt)["optimizer"]
        if state is None:
            fsdp.load_optimizer_shards(self.model, self.optimizer, str(Path(ckpt) / checkpoint.OPTIMIZER_SHARDS))
        elif self.sharded:
            fsdp.load_optimizer(self.model, self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)


PARAM_GAP = M.DIST_PARAM_GAP
_OPS = ("generate", "score", "optimise", "push_weights", "model_state", "save_model", "save_optimizer",
        "load_optimizer")
_GATHERED = ("generate", "score")


def param_gap(model: torch.nn.Module) -> float:
    """Spread between processes of the summed parameters, relative to their size (0 when in step)."""
    total = float(sum(p.detach().double().sum() for p in model.parameters()))
    hi, lo = D.all_reduce_max(total), -D.all_reduce_max(-total)
    return (hi - lo) / max(1.0, abs(hi))


class Team:
    """Rank 0's handle on every process's worker (see module docstring)."""

    def __init__(self, worker: Worker, max_param_gap: float = 1e-6):
        self.worker = worker
        self.max_param_gap = max_param_gap
        self._stopped = False

    @property
    def world(self) -> int:
        return D.topology().world

    def _run(self, op: str, args):
        if self.world > 1:
            D.broadcast((op, args))
        part = getattr(self.worker, op)(args)
        return D.gather_lists(part) if op in _GATHERED else part

    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int, **settings) -> list[list[Generation]]:
        """The rollout engine's `generate`, spread over the processes; `settings` (top_p, batch_size)
        replace the engine's own for this call."""
        seed = int(torch.randint(0, 2**62, (1,))) if self.world > 1 else None
        return self._run("generate", (prompts, n, {"temperature": temperature, "max_new_tokens": max_new_tokens},
                                      seed, settings))

    def engine_view(self, **settings) -> "EngineView":
        """A rollout-engine-like object whose `generate` runs here with `settings` (evaluation)."""
        return EngineView(self, settings)

    def score(self, rollouts: list[Rollout], entropy_kind: str) -> list[tuple[list[float], float]]:
        return self._run("score", (rollouts, entropy_kind))

    def optimise(self, batch, **kwargs) -> dict[str, float]:
        stats = self._run("optimise", (batch, kwargs))
        gap = stats.get(PARAM_GAP, 0.0)
        if gap > self.max_param_gap:
            raise TeamError(f"training processes hold different weights after the optimiser step "
                            f"(summed parameters differ by {gap:.3g} relative); gradients were not reduced the same way")
        return stats

    def push_weights(self, probe_ids: list[int], dtype: torch.dtype) -> dict[str, float]:
        """After the optimiser step: every rollout engine gets the new weights, checked (engine_sync)."""
        return self._run("push_weights", (probe_ids, dtype))

    def model_state(self) -> dict | None:
        """The full model state gathered from every process (FSDP2), else None (the model holds it)."""
        return self._run("model_state", None) if self.worker.sharded else None

    def model_writer(self):
        """FSDP2: a function writing every process's weight shard into a folder, else None."""
        return (lambda folder: self._run("save_model", str(folder))) if self.worker.sharded else None

    def optimizer_writer(self):
        """FSDP2: a function writing every process's optimiser shard into a folder, else None."""
        return (lambda folder: self._run("save_optimizer", str(folder))) if self.worker.sharded else None

    def load_optimizer(self, ckpt: Path) -> None:
        """Every process loads checkpoint `ckpt`'s optimiser state."""
        self._run("load_optimizer", str(ckpt))

    def stop(self) -> None:
        """Release the followers (idempotent; a no-op with one process)."""
        if self.world > 1 and not self._stopped:
            self._stopped = True
            D.broadcast(("stop", None))
            D.shutdown()


@dataclass
class EngineView:
    team: Team
    settings: dict

    def generate(self, prompts, n, *, temperature: float, max_new_tokens: int):
        return self.team.generate(prompts, n, temperature=temperature, max_new_tokens=max_new_tokens, **self.settings)


def serve(worker: Worker) -> None:
    """A follower's loop: run each operation rank 0 broadcasts until it sends `stop`."""
    while True:
        op, args = D.broadcast(None)
        if op == "stop":
            return
        if op not in _OPS:
            raise TeamError(f"follower got unknown operation {op!r}; expected one of {_OPS} or 'stop'")
        part = getattr(worker, op)(args)
        if op in _GATHERED:
            D.gather_lists(part)
