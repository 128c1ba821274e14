"""Everything a run holds in memory, and how it is opened, resumed and checkpointed.

`open_session` builds the model, tokenizer, optimiser (through Accelerate), rollout engine, verifier
and experience store from the config, and resumes from the run directory's latest checkpoint when
there is one (the database is rolled back to that step, so nothing written after it is counted twice).
Under `torchrun` / `accelerate launch` every process builds the same `Worker` (model, optimiser,
engine); rank 0 also opens the store and runs the flow, the others call `run_follower` (team.py).
"""

from __future__ import annotations

import os
import random
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from exgrpo_core import metrics as M
from exgrpo_core.algorithm.sampler import FreshSampler
from exgrpo_core.config.load import ConfigError
from exgrpo_core.config.redact import masked_config
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.data import questions as data
from exgrpo_core.models import load as models
from exgrpo_core.reward import source as sources
from exgrpo_core.reward.grading import MathVerifier
from exgrpo_core.rollout import overlap
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.run import allocator, checkpoint, layout_choice, locks, reuse, sharded_start
from exgrpo_core.run.start_checks import check_context, check_settings  # noqa: F401 (callers import them here)
from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url
from exgrpo_core.training import distributed as D, fsdp
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
    replay_started_step: int | None = None
    """The step whose verification switched replay on (trained clipped, as a warm-up step)."""
    ref_model: torch.nn.Module | None = None
    resumed_from: int | None = None
    mlflow_run_id: str | None = None
    team: Team | None = None
    reward: object | None = None  # the reward.fn pool or reward.url client; None: math-verify grades
    ahead: object | None = None  # rollout/overlap.py: the sampler copy and step t+1's batch sampled ahead
    _prompt_cache: dict[str, list[int]] = field(default_factory=dict)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def prompt_ids(self, uid: str) -> list[int]:
        """Truncated prompt token ids of a question (chat template or data.prompt_template; cached)."""
        if uid not in self._prompt_cache:
            self._prompt_cache[uid] = data.prompt_token_ids(
                self.tokenizer, self.questions[uid], self.cfg.rollout.max_prompt_tokens)
        return self._prompt_cache[uid]

    def loop_state(self) -> dict:
        return {"run_id": self.run_id, "replay_active": self.replay_active, "sampler": self.sampler.state_dict(),
                "rng": self.rng.getstate(), "mlflow_run_id": self.mlflow_run_id, "ahead": overlap.state(self.ahead)}

    def save(self, before_commit=None) -> Path:
        """Checkpoint the completed step `self.step - 1` (FSDP2: weights gathered or per process as
        run.checkpoint_weights says, optimiser per process); `before_commit` as in `save_checkpoint`."""
        shards = self.cfg.run.checkpoint_weights == "sharded"
        path = checkpoint.save_checkpoint(
            self.run_dir, self.step - 1, self.accelerator.unwrap_model(self.model), self.tokenizer,
            self.optimizer, self.loop_state(), keep=self.cfg.run.keep_checkpoints,
            model_state=None if shards else self.team.model_state(), optimizer_shards=self.team.optimizer_writer(),
            model_shards=self.team.model_writer() if shards else None,
            background=fsdp.wait_writes if self.cfg.run.async_checkpoint else None, before_commit=before_commit)
        if self.step >= self.cfg.run.steps:  # the run's last checkpoint is complete when this returns
            checkpoint.finish_pending(self.run_dir)
        return path

    def close(self) -> None:
        for fn in reversed(self._closers):
            fn()
        self._closers.clear()


def open_session(cfg: ExGRPOConfig, verify: Verify | None = None) -> Session:
    """Build or resume the run described by `cfg` (see module docstring); rank 0 with several processes."""
    locks.check_run_name(cfg.run.name)  # `../x` would write outside run.output_dir
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    db_url = resolve_db_url(cfg.run.db_url, run_dir)
    locks.lock_run(run_dir, cfg.run.name, db_url)  # one process per run: a second is refused, naming the first
    previous_malloc = allocator.use(cfg.run.malloc)
    try:
        ckpt = checkpoint.resume_point(run_dir) if cfg.run.resume != "never" else None  # verified
        if cfg.run.resume == "must" and ckpt is None:
            raise ResumeError(f"run.resume=must but {run_dir} has no checkpoint to resume from")
        if cfg.run.resume == "never" and checkpoint.latest_checkpoint(run_dir) is not None:
            raise ResumeError(f"{run_dir} already holds checkpoints; pick another run.name or use run.resume=auto")
        check_database(ckpt, db_url)  # before the model loads: a deleted or replaced database is one line
        session = _open(cfg, verify, run_dir, ckpt, db_url)
    except BaseException:
        allocator.use(previous_malloc)
        locks.unlock_run(run_dir)
        raise
    session._closers.insert(0, lambda: allocator.use(previous_malloc))  # runs last on close
    return session


def _open(cfg: ExGRPOConfig, verify: Verify | None, run_dir: Path, ckpt: Path | None, db_url: str) -> Session:
    accelerator = make_accelerator(cfg)
    D.broadcast(str(ckpt) if ckpt else None)  # followers load the same checkpoint (shared filesystem)
    where: dict[str, str] = {}
    questions = data.load_questions(
        cfg.data.train_path, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
        system_prompt=cfg.data.system_prompt, instruction=cfg.data.instruction,
        max_questions=cfg.data.max_questions, locations=where, prompt_template=cfg.data.prompt_template)
    verifier, reward = None, sources.open_source(cfg.reward)  # a reward of the user's: its golds are its own
    if verify is None:
        verifier = MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers)
        questions = questions if reward else _usable(questions, verifier, where)
    # sources checked and read before the model loads; a resumed run was seeded when it started
    warm = reuse.plan_warm_start(cfg, questions, db_url) if ckpt is None else None
    worker, tokenizer = open_worker(cfg, accelerator, ckpt, run_dir)

    store = ExperienceStore(db_url)
    locks.pin_database(run_dir, cfg.run.name, db_url)  # the file exists now: lock its other (hard-linked) names
    state = checkpoint.load_trainer_state(ckpt) if ckpt else None
    run_id, unfinished = (state["loop"]["run_id"], None) if state else _unfinished_run(cfg, store)
    store.start_run(run_id, cfg.run.name, cfg.preset, masked_config(cfg), cfg.rollout.group_size)  # no credentials
    store.register_questions(run_id, questions)
    session = Session(cfg=cfg, run_id=run_id, run_dir=run_dir, model=worker.model, tokenizer=tokenizer,
        optimizer=worker.optimizer, accelerator=accelerator, engine=worker.engine, verify=verify, store=store,
        questions={q.uid: q for q in questions}, sampler=FreshSampler([q.uid for q in questions], cfg.run.seed),
        rng=random.Random(cfg.run.seed), ref_model=worker.ref_model, team=Team(worker), reward=reward)
    if hasattr(reward, "close"):
        session._closers.append(reward.close)
    if verifier is not None:
        session.verify = verifier.verify
        session._closers.append(verifier.close)
    session._closers.append(lambda: locks.unlock_run(run_dir))  # runs last on close
    session._closers.append(store.close)
    session._closers.append(session.team.stop)  # runs first on close: followers exit even if a close fails
    session._closers.append(lambda: checkpoint.close_pending(run_dir))  # an async checkpoint completes first
    if state:
        _restore(session, state, ckpt)
    elif unfinished:  # started before, never checkpointed: the same run again from step 0
        session.mlflow_run_id = unfinished["mlflow_run_id"]
        store.rollback_to(run_id, -1)
    if warm:  # once per run: a run seeded before (killed before its first checkpoint) is not seeded again
        store.seed_pool(run_id, warm["exports"], warm["record"])
    return session


def check_database(ckpt: Path | None, db_url: str) -> None:
    """Refuse to resume from `ckpt` when the experience database lacks its run, or stores it below the
    checkpoint's step (a deleted or replaced database): one ResumeError line naming both and the fixes."""
    if ckpt is None:
        return
    from exgrpo_core.store.engine import mask_url, parse_url

    path = Path(ckpt) / checkpoint.STATE_FILE
    try:  # memory-mapped: the optimiser's tensors are not read
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:
        state = checkpoint.load_trainer_state(ckpt)
    step, run_id = state["step"], state["loop"]["run_id"]
    url = parse_url(db_url)
    file = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
    row = None
    if not file or Path(url.database).expanduser().is_file():  # a missing SQLite file is not created here
        with ExperienceStore(db_url) as store:
            row = store.get_run(run_id)
    if row is not None and row["step"] >= step:
        return
    found = "has no such run" if row is None else f"stores it only up to step {M.step_number(row['step'])}"
    raise ResumeError(  # steps as users read them (metrics.step_number), not the stored 0-based indices
        f"checkpoint {ckpt.name} is step {M.step_number(step)} of run {run_id}, but the experience database "
        f"{mask_url(url)} "
        f"{found} (deleted or replaced?): point run.db_url at the database this run trained with, or move "
        f"{ckpt.parent} aside to start the run again")


_GOLD_VERDICTS: dict[str, str | None] = {}  # gold -> why it cannot be parsed (None: it can); once per process


def _gold_problems(verifier: MathVerifier, answers: list[str]) -> dict[str, str]:
    """The unusable golds among `answers` -> why. A gold graded before in this process is not graded again;
    the verifier is told of the bad ones (it scores them at once)."""
    todo = sorted({a for a in answers if a not in _GOLD_VERDICTS})
    fresh = verifier.check_golds(todo) if todo else {}
    _GOLD_VERDICTS.update({a: fresh.get(a) for a in todo})
    bad = {a: _GOLD_VERDICTS[a] for a in set(answers) if _GOLD_VERDICTS[a]}
    if bad.keys() - fresh.keys():
        verifier.check_golds(sorted(bad.keys() - fresh.keys()))
    return bad


def check_golds(cfg: ExGRPOConfig, questions: list[Question]) -> None:
    """Before anything slow (the CLI: before Prefect starts), one DataError line when no question has a
    usable gold answer; dropping some is warned once, when the session opens. A reward.fn / url is checked
    instead (it imports, or answers): its golds are its own."""
    if sources.check(cfg.reward):
        return
    verifier = MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers)
    try:
        bad = _gold_problems(verifier, [q.answer for q in questions])
    finally:
        verifier.close()
    if questions and all(q.answer in bad for q in questions):
        rows = ", ".join(f"{q.uid} ({bad[q.answer]})" for q in questions[:10])
        more = f" and {len(questions) - 10} more" if len(questions) > 10 else ""
        raise data.DataError(f"no question has a usable gold answer: {rows}{more}")


def _usable(questions: list[Question], verifier: MathVerifier, where: dict[str, str]) -> list[Question]:
    """Drop the questions whose gold answer cannot be parsed within the timeout (checked once, here),
    with one warning naming their rows; a set with no usable gold left is an error."""
    bad = _gold_problems(verifier, [q.answer for q in questions])
    if not bad:
        return questions
    dropped = [q for q in questions if q.answer in bad]
    rows = ", ".join(f"{where.get(q.uid, q.uid)} ({bad[q.answer]})" for q in dropped[:10])
    more = f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""
    if len(dropped) == len(questions):
        verifier.close()
        raise data.DataError(f"no question has a usable gold answer: {rows}{more}")
    warnings.warn(f"{len(dropped)} of {len(questions)} questions skipped, their gold answers cannot be parsed "
                  f"within reward.timeout_s: {rows}{more}", stacklevel=2)
    return [q for q in questions if q.answer not in bad]


def _unfinished_run(cfg: ExGRPOConfig, store: ExperienceStore) -> tuple[str, dict | None]:
    """Without a checkpoint: the latest run of this name when it never finished (killed before its first
    checkpoint, failed at start-up), which is continued rather than a second run minted; else a new id."""
    prev = store.find_run_by_name(cfg.run.name)
    row = store.get_run(prev) if prev else None
    if row is None or row["status"] == "finished":
        return uuid.uuid4().hex, None
    if cfg.run.resume == "never":  # a new run was asked for; the old one is dead (this process holds the lock)
        if row["status"] == "running":
            store.update_run(prev, status="killed")
        return uuid.uuid4().hex, None
    return prev, row


def run_follower(cfg: ExGRPOConfig) -> None:
    """A process of rank > 0: build the same worker as rank 0 and compute its shares until told to stop."""
    check_settings(cfg)  # rank 0's pre-flight refusals, here too, before joining the process group
    allocator.use(cfg.run.malloc)
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
    if D.topology().world > 1:
        D.host_group()  # NCCL serves no host tensor: the gloo side group, made first on every process
    return acc


SUPPORTED_DISTRIBUTED = ("NO", "MULTI_CPU", "MULTI_GPU")


def open_worker(cfg: ExGRPOConfig, accelerator, ckpt: Path | None, run_dir: Path) -> tuple[Worker, object]:
    """Model (from the checkpoint when resuming), optimiser, reference model and rollout engine."""
    world, tp = D.topology().world, cfg.rollout.vllm_tensor_parallel_size
    if cfg.rollout.engine == "vllm" and world > 1 and world % tp:
        raise ConfigError(f"rollout.vllm_tensor_parallel_size={tp} must divide the {world} training processes: "
                         "each group of that many processes shares one colocated vLLM engine")
    check_context(cfg)
    if cfg.rollout.engine == "remote":  # before the model loads: vLLM's trainer side, the server's routes
        from exgrpo_core.rollout import remote

        remote.require_vllm()
        remote.check_server(remote.ServerClient(cfg.rollout.server_url, api_key=_server_api_key(cfg),
                                                timeout_s=cfg.rollout.server_timeout_s))
    here = layout_choice.choose_here(cfg, accelerator.device, world) if D.topology().rank == 0 else None
    layout_choice.apply(cfg, D.broadcast(here))  # auto sharding / checkpointing: rank 0's choice, in place
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    source = str(ckpt) if ckpt else cfg.model.name_or_path
    sharded = cfg.train.sharding == "fsdp2"
    if sharded:  # FSDP2 before the optimiser, which must see the sharded parameters; no DDP wrapper
        world = D.topology().world
        try:  # HSDP: replicate across machines, shard within one
            shape = fsdp.mesh_shape(cfg.train.hsdp, world, fsdp.local_world_size(world), cfg.train.shard_size)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        model, tokenizer = sharded_start.load_sharded_policy(  # meta, sharded, filled: no whole copy per process
            source, device=accelerator.device, bf16=accelerator.mixed_precision == "bf16", shape=shape,
            dtype=master_dtype(cfg, accelerator), cpu_offload=cfg.train.cpu_offload, tiny=cfg.model.tiny.model_dump(),
            seed=cfg.run.seed, warm_start=cfg.model.warm_start.model_dump(), hf_overrides=cfg.model.hf_overrides,
            gradient_checkpointing=cfg.model.gradient_checkpointing)
    else:
        model, tokenizer = models.load_policy(source, dtype=master_dtype(cfg, accelerator),
                                              tiny=cfg.model.tiny.model_dump(), seed=cfg.run.seed,
                                              warm_start=cfg.model.warm_start.model_dump(),
                                              hf_overrides=cfg.model.hf_overrides)
    if cfg.model.gradient_checkpointing and not sharded:  # transformers 5 renamed it (the old name warns)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    ref_model = None
    if cfg.loss.kl_coef > 0:
        ref_model, _ = models.load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype,
                                          tiny=cfg.model.tiny.model_dump(), seed=cfg.run.seed,
                                          warm_start=cfg.model.warm_start.model_dump(),
                                          hf_overrides=cfg.model.hf_overrides)
        ref_model.eval().requires_grad_(False)
    if cfg.rollout.engine == "vllm":  # vLLM loads the starting weights from a folder
        source = _vllm_base(model, tokenizer, source, run_dir)
    fsdp.background_writes(sharded and cfg.run.async_checkpoint)  # every process writes its shards alike
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


def master_dtype(cfg: ExGRPOConfig, accelerator) -> str:
    """The trained weights' dtype: float32 masters when the GPU computes in bf16 (FSDP2's mixed-precision
    policy casts the gathered layers, Accelerate's autocast the matrix products), as the memory plan
    assumes; bf16 weights would round away AdamW steps below ~1/256 of a weight (lr 1e-6). Else
    `model.dtype` itself (CPU runs)."""
    return "float32" if getattr(accelerator, "mixed_precision", "no") == "bf16" else cfg.model.dtype


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
        engine.decoder, engine.streams = cfg.rollout.decoder, cfg.rollout.decode_streams
        engine.matmul = cfg.rollout.decode_matmul
        engine.compact_every = cfg.rollout.decode_compact_every
        return engine
    if cfg.rollout.engine == "remote":  # the server may hold other weights (another run, a checkpoint): push
        from functools import partial

        from exgrpo_core.rollout.engine import eos_token_ids
        from exgrpo_core.rollout.remote import RemoteEngine, weight_transfer

        transfer = partial(weight_transfer(cfg.rollout.weight_transfer), host=cfg.rollout.server_group_host,
                           port=cfg.rollout.server_group_port)
        return RemoteEngine(  # open_worker pushes the trainer's weights (gathered first with FSDP2)
            cfg.rollout.server_url, tokenizer, params=[(n, tuple(p.shape)) for n, p in model.named_parameters()],
            eos_ids=eos_token_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer),
            weight_dtype=getattr(torch, cfg.model.dtype), top_p=cfg.rollout.top_p,
            timeout_s=cfg.rollout.server_timeout_s, api_key=_server_api_key(cfg), open_transfer=transfer)
    from exgrpo_core.rollout.vllm_engine import VLLMEngine

    topo, tp = D.topology(), cfg.rollout.vllm_tensor_parallel_size
    return VLLMEngine(source, tokenizer, top_p=cfg.rollout.top_p, dtype=cfg.model.dtype,
                      seed=cfg.run.seed + topo.rank // tp, distributed=topo.world > 1,
                      gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization, tensor_parallel_size=tp,
                      max_model_len=cfg.rollout.max_prompt_tokens + max(cfg.rollout.max_response_tokens,
                                                                       cfg.eval.max_response_tokens or 0),
                      enforce_eager=cfg.rollout.vllm_enforce_eager, sleep=cfg.rollout.vllm_sleep,
                      exact_resume=cfg.rollout.vllm_exact_resume, hf_overrides=cfg.model.hf_overrides)


def _server_api_key(cfg: ExGRPOConfig) -> str | None:
    """rollout.server_api_key, else the EXGRPO_ROLLOUT_API_KEY environment variable."""
    from exgrpo_core.rollout.remote import API_KEY_ENV

    return cfg.rollout.server_api_key or os.environ.get(API_KEY_ENV) or None


def _vllm_base(model, tokenizer, source: str, run_dir: Path) -> str:
    """A plain Hugging Face folder vLLM can load: `source` itself when it is one (a checkpoint, a local
    model), else `<run_dir>/vllm_base` written once by rank 0 (a tiny or GGUF model, a hub name, a
    checkpoint with weight shards); the session pushes the trainer's weights when it opens anyway."""
    if Path(source).is_dir() and not checkpoint.has_weight_shards(source):
        return source
    path = run_dir / "vllm_base"
    state = fsdp.full_model_state(model) if fsdp.is_sharded(model) else None  # FSDP2: every process gathers
    if D.topology().is_main and not (path / "config.json").exists():
        model.save_pretrained(path, state_dict=state)
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
    session.mlflow_run_id, session.ahead = loop.get("mlflow_run_id"), overlap.from_state(loop.get("ahead"))
    session.store.rollback_to(session.run_id, step)
    session.step = step + 1
    session.resumed_from = step


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x

