"""Everything a run holds in memory, and how it is opened, resumed and checkpointed.

`open_session` builds the model, tokenizer, optimiser (through Accelerate), rollout engine, verifier
and experience store from the config, and resumes from the run directory's latest checkpoint when
there is one (the database is rolled back to that step, so nothing written after it is counted twice).
Under `torchrun` / `accelerate launch` every process builds the same `Worker` (model, optimiser,
engine); rank 0 also opens the store and runs the flow, the others call `run_follower` (team.py).
"""

from __future__ import annotations

import json
import random
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from exgrpo_core import checkpoint, data, models
from exgrpo_core.training import distributed as D, fsdp
from exgrpo_core.config import ExGRPOConfig
from exgrpo_core.config_io import ConfigError
from exgrpo_core.rewards import MathVerifier
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.algorithm.sampler import FreshSampler
from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url
from exgrpo_core.training.team import Team, Worker, serve
from exgrpo_core.types import Question

Verify = Callable[[list[str], list[str]], list[tuple[float, str]]]


class ResumeError(RuntimeError):
    """The run directory and `run.resume` disagree (e.g. `must` without a checkpoint)."""


@dataclass
class Session:
    cfg: ExGRPOConfig
    run_id: str
    run_dir: Path
    model: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    accelerator: object
    engine: TransformersEngine
    verify: Verify
    store: ExperienceStore
    questions: dict[str, Question]
    sampler: FreshSampler
    rng: random.Random
    step: int = 0
    replay_active: bool = False
    ref_model: torch.nn.Module | None = None
    resumed_from: int | None = None
    mlflow_run_id: str | None = None
    team: Team | None = None
    _prompt_cache: dict[str, list[int]] = field(default_factory=dict)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def prompt_ids(self, uid: str) -> list[int]:
        """Chat-templated, truncated prompt token ids of a question (cached)."""
        if uid not in self._prompt_cache:
            self._prompt_cache[uid] = data.prompt_token_ids(
                self.tokenizer, self.questions[uid], self.cfg.rollout.max_prompt_tokens)
        return self._prompt_cache[uid]

    def loop_state(self) -> dict:
        return {"run_id": self.run_id, "replay_active": self.replay_active, "sampler": self.sampler.state_dict(),
                "rng": self.rng.getstate(), "mlflow_run_id": self.mlflow_run_id}

    def save(self) -> Path:
        """Checkpoint the completed step `self.step - 1` (FSDP2: weights gathered or per process as
        run.checkpoint_weights says, optimiser per process)."""
        shards = self.cfg.run.checkpoint_weights == "sharded"
        return checkpoint.save_checkpoint(
            self.run_dir, self.step - 1, self.accelerator.unwrap_model(self.model), self.tokenizer,
            self.optimizer, self.loop_state(), keep=self.cfg.run.keep_checkpoints,
            model_state=None if shards else self.team.model_state(), optimizer_shards=self.team.optimizer_writer(),
            model_shards=self.team.model_writer() if shards else None)

    def close(self) -> None:
        for fn in reversed(self._closers):
            fn()
        self._closers.clear()


def open_session(cfg: ExGRPOConfig, verify: Verify | None = None) -> Session:
    """Build or resume the run described by `cfg` (see module docstring); rank 0 with several processes."""
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    ckpt = checkpoint.latest_checkpoint(run_dir) if cfg.run.resume != "never" else None
    if cfg.run.resume == "must" and ckpt is None:
        raise ResumeError(f"run.resume=must but {run_dir} has no checkpoint to resume from")
    if cfg.run.resume == "never" and checkpoint.latest_checkpoint(run_dir) is not None:
        raise ResumeError(f"{run_dir} already holds checkpoints; pick another run.name or use run.resume=auto")
    run_dir.mkdir(parents=True, exist_ok=True)
    accelerator = make_accelerator(cfg)
    D.broadcast(str(ckpt) if ckpt else None)  # followers load the same checkpoint (shared filesystem)
    questions = data.load_questions(
        cfg.data.train_path, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
        system_prompt=cfg.data.system_prompt, instruction=cfg.data.instruction,
        max_questions=cfg.data.max_questions)
    worker, tokenizer = open_worker(cfg, accelerator, ckpt, run_dir)

    store = ExperienceStore(resolve_db_url(cfg.run.db_url, run_dir))
    state = checkpoint.load_trainer_state(ckpt) if ckpt else None
    run_id = state["loop"]["run_id"] if state else uuid.uuid4().hex
    store.start_run(run_id, cfg.run.name, cfg.preset, json.loads(cfg.model_dump_json()), cfg.rollout.group_size)
    store.register_questions(run_id, questions)

    session = Session(
        cfg=cfg, run_id=run_id, run_dir=run_dir, model=worker.model, tokenizer=tokenizer,
        optimizer=worker.optimizer, accelerator=accelerator, engine=worker.engine,
        verify=verify, store=store, questions={q.uid: q for q in questions},
        sampler=FreshSampler([q.uid for q in questions], cfg.run.seed), rng=random.Random(cfg.run.seed),
        ref_model=worker.ref_model, team=Team(worker))
    if verify is None:
        verifier = MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers)
        session.verify = verifier.verify
        session._closers.append(verifier.close)
    session._closers.append(store.close)
    session._closers.append(session.team.stop)  # runs first on close: followers exit even if a close fails
    if state:
        _restore(session, state, ckpt)
    return session


def run_follower(cfg: ExGRPOConfig) -> None:
    """A process of rank > 0: build the same worker as rank 0 and compute its shares until told to stop."""
    accelerator = make_accelerator(cfg)
    ckpt = D.broadcast(None)
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    worker, _ = open_worker(cfg, accelerator, Path(ckpt) if ckpt else None, run_dir)
    serve(worker)  # on resume the first operation is load_optimizer
    D.shutdown()


def make_accelerator(cfg: ExGRPOConfig):
    """Accelerate for this process; under torchrun / accelerate launch it joins the process group.

    DDP's per-forward buffer broadcast is off: processes run different numbers of forward passes
    (their shares differ), and gradients are summed explicitly once per optimiser step (optimise.py).
    """
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    gpu = torch.cuda.is_available()
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")  # we mean: no buffer sync at all
    acc = Accelerator(cpu=not gpu, mixed_precision="bf16" if cfg.model.dtype == "bfloat16" and gpu else "no",
                      kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False),
                                       InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.train.dist_timeout_s))])
    kind = str(getattr(acc.distributed_type, "value", acc.distributed_type))
    if kind not in SUPPORTED_DISTRIBUTED:
        raise ConfigError(f"accelerate distributed_type {kind} is not supported yet: use MULTI_GPU (DDP) or "
                         f"MULTI_CPU, e.g. configs/accelerate/ddp-8gpu.yaml (docs/scaling.md)")
    return acc


SUPPORTED_DISTRIBUTED = ("NO", "MULTI_CPU", "MULTI_GPU")


def open_worker(cfg: ExGRPOConfig, accelerator, ckpt: Path | None, run_dir: Path) -> tuple[Worker, object]:
    """Model (from the checkpoint when resuming), optimiser, reference model and rollout engine."""
    world, tp = D.topology().world, cfg.rollout.vllm_tensor_parallel_size
    if cfg.rollout.engine == "vllm" and world > 1 and world % tp:
        raise ConfigError(f"rollout.vllm_tensor_parallel_size={tp} must divide the {world} training processes: "
                         "each group of that many processes shares one colocated vLLM engine")
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    source = str(ckpt) if ckpt else cfg.model.name_or_path
    model, tokenizer = models.load_policy(source, dtype=cfg.model.dtype, tiny=cfg.model.tiny.model_dump(),
                                          seed=cfg.run.seed)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    ref_model = None
    if cfg.loss.kl_coef > 0:
        ref_model, _ = models.load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype,
                                          tiny=cfg.model.tiny.model_dump(), seed=cfg.run.seed)
        ref_model.eval().requires_grad_(False)
    if cfg.rollout.engine == "vllm":  # vLLM loads the starting weights from a folder: write it before sharding
        source = _vllm_base(model, tokenizer, source, run_dir)
    sharded = cfg.train.sharding == "fsdp2"
    if sharded:  # FSDP2 before the optimiser, which must see the sharded parameters; no DDP wrapper
        model = fsdp.shard_model(model, accelerator.device, bf16=accelerator.mixed_precision == "bf16",
                                 cpu_offload=cfg.train.cpu_offload)
    optimizer = adamw(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    if not sharded:
        model, optimizer = accelerator.prepare(model, optimizer)
    if ref_model is not None:
        ref_model.to(accelerator.device)
    engine = _make_engine(cfg, accelerator.unwrap_model(model), tokenizer, source)
    if isinstance(engine, TransformersEngine):  # it runs the trainer's module: with FSDP2 a collective
        engine.synced = sharded
    worker = Worker(model=model, optimizer=optimizer, accelerator=accelerator, engine=engine, ref_model=ref_model,
                    scoring_micro_batch=2 * cfg.train.micro_batch_size, temperature=cfg.rollout.temperature,
                    sharded=sharded, share_prompts=cfg.train.share_prompt_forward)
    if cfg.rollout.engine != "transformers":  # an engine with its own weights (a server that served another
        worker.push_weights((None, None))   # run, a vLLM base) starts from the trainer's; FSDP2 gathers as it goes
    return worker, tokenizer


def adamw(params, *, lr: float, weight_decay: float, eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each tensor: ~4x faster than the per-tensor loop on
    CPU, and what Hugging Face's Trainer uses) where every parameter lives on a device it supports."""
    params = list(params)
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=fused or None)


def _make_engine(cfg: ExGRPOConfig, model, tokenizer, source: str):
    """The transformers engine shares the trainer's module; vLLM loads its own copy of the weights; a
    remote engine is a rollout server, which gets the trainer's weights at once."""
    if cfg.rollout.engine == "transformers":
        engine = TransformersEngine(model, tokenizer, top_p=cfg.rollout.top_p,
                                    batch_size=cfg.rollout.generation_batch_size)
        engine.decoder = cfg.rollout.decoder
        return engine
    if cfg.rollout.engine == "remote":  # the server may hold other weights (another run, a checkpoint): push
        from exgrpo_core.rollout.remote import RemoteEngine

        engine = RemoteEngine(cfg.rollout.server_url, tokenizer, top_p=cfg.rollout.top_p,
                              timeout_s=cfg.rollout.server_timeout_s, transport=cfg.rollout.server_weight_transport,
                              group_host=cfg.rollout.server_group_host)
        return engine  # open_worker pushes the trainer's weights (gathered first with FSDP2)
    from exgrpo_core.rollout.vllm_engine import VLLMEngine

    topo, tp = D.topology(), cfg.rollout.vllm_tensor_parallel_size
    return VLLMEngine(source, tokenizer, top_p=cfg.rollout.top_p, dtype=cfg.model.dtype,
                      seed=cfg.run.seed + topo.rank // tp, distributed=topo.world > 1,
                      gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization, tensor_parallel_size=tp,
                      max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens,
                      enforce_eager=cfg.rollout.vllm_enforce_eager, sleep=cfg.rollout.vllm_sleep)


def _vllm_base(model, tokenizer, source: str, run_dir: Path) -> str:
    """A plain Hugging Face folder vLLM can load: `source` itself when it is one (a checkpoint, a local
    model), else `<run_dir>/vllm_base` written once by rank 0 (a tiny or GGUF model, a hub name, a
    checkpoint with weight shards); the session pushes the trainer's weights when it opens anyway."""
    if Path(source).is_dir() and not checkpoint.has_weight_shards(source):
        return source
    path = run_dir / "vllm_base"
    if D.topology().is_main and not (path / "config.json").exists():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    D.barrier()
    return str(path)


def _restore(session: Session, state: dict, ckpt: Path) -> None:
    """Continue after the checkpointed step; drop experience written after it."""
    step = state["step"]
    session.team.load_optimizer(ckpt)  # every process
    checkpoint.set_rng_state(state["rng"])
    loop = state["loop"]
    session.replay_active = loop["replay_active"]
    session.sampler.load_state_dict(loop["sampler"])
    session.rng.setstate(_as_tuple(loop["rng"]))
    session.mlflow_run_id = loop.get("mlflow_run_id")
    session.store.rollback_to(session.run_id, step)
    session.step = step + 1
    session.resumed_from = step


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x

