"""`rollout.*`: how responses are sampled, by which engine, and how weights reach it (part of the config tree
in schema.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from exgrpo_core.config.base import _Section


class RolloutConfig(_Section):
    engine: Literal["transformers", "vllm", "remote"] = "transformers"
    """Rollout backend: transformers (shares the trainer's module), vllm (colocated, GPU only) or
    remote (a stock `vllm serve` on another node, started by `exgrpo rollout-server`; needs `server_url`)."""
    server_url: str | None = None
    """(remote) The `vllm serve` address, e.g. http://rollout-node:8000."""
    server_timeout_s: float = Field(default=600.0, gt=0)
    """(remote) Seconds one request may take (a prompt's long generations, a weight push)."""
    server_api_key: str | None = None
    """(remote) The key the server was started with (its VLLM_API_KEY); default: the EXGRPO_ROLLOUT_API_KEY
    environment variable, which keeps it out of the saved config. vLLM checks it on /v1 and /inference only."""
    server_group_host: str | None = None
    """(remote) This machine's address that the server's GPU workers connect to for the NCCL weight
    transfer (default: this machine's address on the route to the server). The rendezvous (vLLM's
    TCPStore) has no key and listens on this address only: name an interface the server reaches on a
    private network; a wildcard (0.0.0.0, ::) is refused."""
    server_group_port: int = Field(default=0, ge=0, le=65535)
    """(remote) Port of that rendezvous (the trainer hosts it); 0: a free one. Must be reachable from the server."""
    weight_transfer: Literal["auto", "nccl", "gloo"] = "auto"
    """(remote) How weights reach the server, through vLLM's weight-transfer interface: `nccl` (GPU to GPU,
    vLLM's engine), `gloo` (over the host's network, exgrpo_core/rollout/gloo_transfer.py: a server on vLLM's
    CPU build, or a trainer without a GPU); auto: nccl with a CUDA GPU, else gloo. The server must be started
    with the same (`exgrpo rollout-server --weight-transfer`)."""

    @field_validator("server_group_host")
    @classmethod
    def _one_interface(cls, v):
        if v is not None and v.strip("[]") in ("0.0.0.0", "::", ""):
            raise ValueError(f"rollout.server_group_host {v!r} would open the unauthenticated weight-transfer "
                             "rendezvous on every interface (and the server's workers cannot connect to it): "
                             "name this machine's address on the network the rollout server reaches")
        return v

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data):
        if isinstance(data, dict) and "server_weight_transport" in data:
            raise ValueError("rollout.server_weight_transport was removed: weights now go to the server through "
                             "vLLM's NCCL weight-transfer engine (set rollout.server_group_host / server_group_port "
                             "if the server's workers cannot reach this machine's default address)")
        if isinstance(data, dict) and data.get("decoder") == "own":
            data = {**data, "decoder": "eager"}  # the eager decoder's former name
        return data

    overlap: int = Field(default=0, ge=0, le=8)
    """Steps the sampler runs ahead of the trainer: 0, the paper's synchronous loop; N >= 1: while step t trains,
    the fresh rollouts of steps up to t+N are sampled, step t+N's from the weights step t started with
    (rollout/overlap.py; the transformers engine and the remote one, N > 1 on the transformers engine's thread
    sampler only; colocated vLLM shares the GPU and stays synchronous)."""
    overlap_sampler: Literal["thread", "process"] = "thread"
    """(overlap, transformers engine) Where step t+1's batch is sampled: `thread`, a background thread on a copy
    of the model (it shares the GIL with the trainer); `process`, a child process holding the copy in shared
    memory, its weights written and checked (float64 checksums) at each start (rollout/sampler_process.py)."""
    overlap_timeout_s: float | None = Field(default=None, gt=0)
    """(overlap) The longest a step waits for its batch sampled ahead: past it the sampler is stopped (the
    process sampler's child killed) and the run ends in one line, resumable (None: no limit)."""
    max_staleness: int | None = Field(default=None, ge=0)
    """(overlap) A fresh batch sampled more than this many steps before the step that trains it is dropped,
    counted (rollout/stale_dropped) and sampled again; default: `overlap`."""

    @model_validator(mode="after")
    def _overlap_engine(self):
        if self.overlap and self.engine == "vllm":
            raise ValueError(f"rollout.overlap={self.overlap} needs rollout.engine=transformers or remote: colocated "
                             "vLLM shares the GPU with the trainer and stays synchronous (set rollout.overlap=0)")
        if self.overlap and self.engine == "transformers" and self.decoder == "generate":
            raise ValueError("rollout.overlap needs the eager or static decoder (rollout.decoder=auto): transformers' "
                             "generate draws from torch's global generator, shared with the trainer's thread")
        if self.overlap > 1 and self.engine == "remote":
            raise ValueError(f"rollout.overlap={self.overlap} with rollout.engine=remote: each push pauses the server "
                             "until the batch sent last has finished, so the server runs one batch ahead at most "
                             "(set rollout.overlap=1)")
        if self.overlap > 1 and self.overlap_sampler == "process":
            raise ValueError(f"rollout.overlap={self.overlap} with rollout.overlap_sampler=process: the sampler process "
                             "holds one batch at a time (set rollout.overlap=1, or rollout.overlap_sampler=thread)")
        if self.overlap_sampler == "process" and self.engine != "transformers":
            raise ValueError(f"rollout.overlap_sampler=process is for the transformers engine; with rollout.engine="
                             f"{self.engine} the sampler is the engine itself (set rollout.overlap_sampler=thread)")
        return self

    group_size: int = Field(default=8, ge=2)
    """K responses per question (paper: 8)."""
    dynamic_sampling: bool = False
    """(replay lab, DAPO) Fresh groups whose rewards are all equal are dropped from the training batch (still
    recorded and collected as usual) and the batch is refilled with further fresh questions, for at most
    `dynamic_sampling_rounds` extra generation rounds (algorithm/dynamic_sampling.py)."""
    dynamic_sampling_rounds: int = Field(default=3, ge=1)
    """(dynamic_sampling) Extra generation rounds per step at most; what is still dropped after them is not replaced."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (paper: 1.0)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling."""
    max_prompt_tokens: int = Field(default=1024, ge=1)
    """Prompts are left-truncated to this length (paper: 1024)."""
    max_response_tokens: int = Field(default=8192, ge=1)
    """Responses stop here and are flagged truncated (paper: 8192)."""
    generation_batch_size: int = Field(default=64, ge=1)
    """Sequences generated per `generate` call."""
    decoder: Literal["auto", "eager", "static", "generate"] = "auto"
    """(transformers) The decode loop: `eager` (rollout/decode.py: finished rows leave the batch, inverse-CDF
    sampling, in-place KV cache; `own` is read as `eager`), `static` (rollout/static_decode.py: a bf16 copy
    of the policy refreshed each `generate` call, fixed-shape steps, on CUDA under torch.compile with CUDA
    graphs; the same sampler), `generate` (transformers' loop; the samples differ for a seed), or `auto`:
    `static` on CUDA, `eager` on the CPU."""
    decode_compact_every: int = Field(default=16, ge=1)
    """(transformers, eager and static decoders) End-of-sequence checks (and the eager decoder's row
    compaction) run after every this many steps: the loop's only host syncs (one each). Between them
    finished rows are fed the pad token and their outputs masked: the same samples for any value."""
    decode_streams: int = Field(default=0, ge=0)
    """(transformers, own decoder, CPU) Decode each batch of sampling and evaluation in this many parts,
    each in its own Python thread with its share of torch's threads (0: auto, min(2, torch threads));
    parts of fewer than 8 rows are not made. The same samples for a seed (every step's uniforms are drawn
    for the whole batch); small decode GEMMs scale badly over torch's intra-op threads, and on a shared
    machine every op waits for its slowest thread. On an idle 2-core machine 1 decodes ~15% faster
    (docs/benchmarks/speed.md)."""
    decode_matmul: Literal["auto", "torch"] = "auto"
    """(transformers, own decoder) `auto`: when sampling runs on the CPU in float32, the linear layers
    multiply by weights packed once into oneDNN's layout (rollout/packed.py): 1.3-1.6x faster at the
    few rows of a decode step; the same product up to float rounding (~1e-6), so the same tokens
    except where a draw falls that close to a boundary. `torch`: torch's default product (MKL)."""
    rescore: Literal["auto", "always"] = "auto"
    """Trainer forward over fresh rollouts for behaviour log-probs and H(o). `always`: as verl / the
    authors' code. `auto`: skipped when the sampler's numbers already are the trainer's (transformers
    engine, same weights, top_p = 1, sampling computed in float32 (model dtype and no mixed precision):
    they differ only by float rounding)."""
    vllm_gpu_memory_utilization: float = Field(default=0.4, gt=0, lt=1)
    """(vllm) Share of each GPU the colocated engine may take (weights + KV cache)."""
    vllm_tensor_parallel_size: int = Field(default=1, ge=1)
    """(vllm) GPUs one engine spans (paper recipe: 2)."""
    vllm_enforce_eager: bool = False
    """(vllm) Skip CUDA graph capture (slower decoding, faster start, less memory)."""
    vllm_sleep: bool = False
    """(vllm) Put the engine to sleep after sampling (vLLM sleep level 2: KV cache and weights released,
    nothing copied to CPU memory) so scoring and training get its GPU memory; the push wakes the weights
    alone and overwrites them, the KV cache wakes just before the next sampling."""
    vllm_exact_resume: bool = False
    """(vllm) A resumed run samples the tokens the uninterrupted run did: every request seeded from the
    checkpointed RNG and VLLM_BATCH_INVARIANT=1. Slower (vLLM's per-request sampling path, batch-invariant
    kernels, which also apply to training in the same process). Off: the engine is seeded once per
    tensor-parallel group; a resume keeps questions, buffer and weights exact, not the sampled tokens."""
