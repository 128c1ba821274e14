"""A CPU stand-in for the `vllm` package, held to vLLM's recorded API (exgrpo_core/rollout/vllm_contract.json;
tests/exgrpo_core/rollout/test_vllm_contract.py checks every signature here against it).

What it models of vLLM 0.33, because our engine's correctness depends on it:
- `LLM(**kwargs)` refuses a keyword vLLM's `LLM` / `EngineArgs` do not have;
- `logprobs_mode`: `raw_logprobs` (vLLM's default: before temperature) or `processed_logprobs`;
- seeds: a request's `seed` draws its i-th sample from seed + i (vLLM's parallel sampling), else the
  engine's own stream, seeded once by `LLM(seed=...)`;
- sleep: level 1 keeps the weights (offloaded), level 2 discards them (here: NaN) and keeps buffers;
  `wake_up(tags)` wakes `weights` and / or `kv_cache`; sampling needs both, a weight load needs weights;
- `collective_rpc` into our worker extension, which reaches the model through `Worker.get_model()`.
A Hugging Face model loaded from the engine's folder does the maths. Every `LLM` records its keyword
arguments, prompts, sampled tokens and calls, so tests can check what several processes' engines did.

`install()` puts it in `sys.modules`; `cuda()` lets `VLLMEngine` believe it has a GPU.
"""

from __future__ import annotations

import json
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

CONTRACT = json.loads((Path(__file__).resolve().parents[2] / "exgrpo_core" / "rollout" /
                       "vllm_contract.json").read_text())
SLEEP_TAGS = ("weights", "kv_cache")


def llm_keywords() -> set[str]:
    """What `LLM(...)` accepts: its own parameters and `EngineArgs`' fields (its **kwargs go there)."""
    own = {p[0] for p in CONTRACT["classes"]["LLM"]["methods"]["__init__"]["params"]}
    args = CONTRACT["classes"]["EngineArgs"]
    return own | {f for f in args["fields"] if f not in args.get("fields_not_in_init", [])}


class SamplingParams:
    def __init__(self, *, n=1, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=None, prompt_logprobs=None,
                 stop_token_ids=None, skip_special_tokens=True, seed=None):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": list(prompt_token_ids)}


class Worker:
    """The parts of vLLM's GPU worker our extension may use."""

    def __init__(self, llm: "LLM", model):
        self._llm, self._model = llm, model
        self.device, self.model_config = torch.device("cpu"), SimpleNamespace()
        self.reloading = False  # inside vLLM's layerwise reload (initialize ... finalize)

    def get_model(self):
        assert "weights" not in self._llm.asleep, "the model's weights are asleep"
        return self._model


class LLM:
    instances: list["LLM"] = []  # every engine built in this process

    def __init__(self, model: str, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM

        from exgrpo_core.rollout.vllm_engine import WeightSyncExtension

        unknown = set(kwargs) - llm_keywords()
        if unknown:
            raise TypeError(f"vLLM's LLM / EngineArgs have no argument(s) {sorted(unknown)}")
        LLM.instances.append(self)
        self.kwargs = kwargs
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        hf = AutoModelForCausalLM.from_pretrained(model).eval().requires_grad_(False)
        hf.load_weights = lambda weights: _load(hf, weights)  # vLLM's loader takes HF names
        self.worker = type("Worker", (WeightSyncExtension, Worker), {})(self, hf)
        hf.__dict__["_fake_worker"] = self.worker
        self.model = hf
        hf_config = AutoConfig.from_pretrained(model)  # vLLM: the folder's config, then `hf_overrides` by update
        hf_config.update(dict(kwargs.get("hf_overrides") or {}))
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config),
                                          engine_core=SimpleNamespace(shutdown=lambda timeout=None: self.events.append(
                                              "shutdown")))
        self.calls: list[str] = []  # sleep / wake_up / reset_prefix_cache / rpc, in order
        self.events: list[str] = []  # the same and each `generate` (with its prompt count), in order
        self.rpc_calls: list[str] = []
        self.asleep: set[str] = set()
        self.rng = torch.Generator().manual_seed(int(kwargs.get("seed", 0)))  # the engine's own stream
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []
        self.params: list[SamplingParams] = []

    def sleep(self, level: int = 1, mode: str = "abort"):
        assert self.kwargs.get("enable_sleep_mode") and level in (1, 2) and not self.asleep
        self.calls.append(f"sleep({level})")
        self.events.append(self.calls[-1])
        self.asleep = set(SLEEP_TAGS)
        if level == 2:  # the weights' memory is released; only a load refills it
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))

    def wake_up(self, tags: list[str] | None = None):
        tags = list(SLEEP_TAGS) if tags is None else tags
        assert set(tags) <= set(SLEEP_TAGS)
        self.calls.append(f"wake_up({','.join(tags)})")
        self.events.append(self.calls[-1])
        self.asleep -= set(tags)

    def collective_rpc(self, method: str, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        self.events.append(method)
        self.rpc_calls.append(method)
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False):
        self.calls.append("reset_prefix_cache")
        self.events.append("reset_prefix_cache")
        return True

    @torch.no_grad()
    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        assert not self.asleep, f"generate on a sleeping engine ({sorted(self.asleep)} asleep)"
        self.events.append(f"generate({len(prompts)})")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        outs = []
        for prompt, sp in zip(prompts, params):
            ids = prompt["prompt_token_ids"]
            self.prompts.append(ids)
            self.params.append(sp)
            prompt_lp = None
            if sp.prompt_logprobs is not None:
                logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0, :-1].float(), -1)
                prompt_lp = [None] + [{t: SimpleNamespace(logprob=float(logp[i, t]))} for i, t in enumerate(ids[1:])]
            outputs = [self._sample(ids, sp, torch.Generator().manual_seed(sp.seed + i) if sp.seed is not None
                                    else self.rng) for i in range(sp.n)]
            outs.append(SimpleNamespace(outputs=outputs, prompt_logprobs=prompt_lp))
        return outs

    def _sample(self, ids, sp, gen):
        seq, toks, lps = list(ids), [], []
        for _ in range(sp.max_tokens):
            logits = self.model(torch.tensor([seq])).logits[0, -1].float()
            probs = torch.softmax(logits / sp.temperature, -1)
            tok = int(torch.multinomial(probs, 1, generator=gen))
            shown = probs.log() if self.logprobs_mode == "processed_logprobs" else torch.log_softmax(logits, -1)
            seq.append(tok)
            toks.append(tok)
            lps.append({tok: SimpleNamespace(logprob=float(shown[tok]))})
            if tok in (sp.stop_token_ids or []):
                break
        self.sampled.append(toks)
        finish = "stop" if toks and toks[-1] in (sp.stop_token_ids or []) else "length"
        return SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason=finish)


def _load(model, weights) -> None:
    worker = model._fake_worker
    assert worker.reloading, "load_weights outside vLLM's layerwise reload (its loaders are gone after loading)"
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in weights:
            params[name].copy_(t)


def _initialize_layerwise_reload(model) -> None:
    assert not model._fake_worker.reloading, "a reload opened twice"
    model._fake_worker.reloading = True


def _finalize_layerwise_reload(model, model_config) -> None:
    assert model._fake_worker.reloading, "a reload finalized without initialize_layerwise_reload"
    model._fake_worker.reloading = False


def install() -> None:
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    vllm.LLM, vllm.SamplingParams, vllm.inputs, inputs.TokensPrompt = LLM, SamplingParams, inputs, TokensPrompt
    platforms = types.ModuleType("vllm.platforms")  # a CUDA platform: sleep mode exists
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False, is_sleep_mode_available=lambda: True)
    reload = types.ModuleType("vllm.model_executor.model_loader.reload")
    reload.initialize_layerwise_reload, reload.finalize_layerwise_reload = (_initialize_layerwise_reload,
                                                                            _finalize_layerwise_reload)
    sys.modules.update({"vllm": vllm, "vllm.inputs": inputs, "vllm.platforms": platforms,
                        "vllm.model_executor.model_loader.reload": reload})


@contextmanager
def cuda():
    """`VLLMEngine` believes it has a GPU (nothing else does)."""
    with mock.patch("exgrpo_core.rollout.vllm_engine.has_device", return_value=True), \
            mock.patch("exgrpo_core.rollout.vllm_engine.has_cuda", return_value=True):
        yield
