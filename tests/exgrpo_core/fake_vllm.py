"""A CPU stand-in for the `vllm` package, just enough of it for `VLLMEngine`: `LLM` with `generate`
(sampled and prompt log-probs, per-request seeds), `collective_rpc` into our `WeightSyncExtension`,
`reset_prefix_cache`, `sleep` / `wake_up` (a sleeping engine refuses work); `SamplingParams`;
`inputs.TokensPrompt`. A Hugging Face model loaded from the engine's folder does the maths. Every `LLM` records its keyword arguments, the prompts it got and
the token ids it sampled, so tests can check what several processes' engines did.

`install()` puts it in `sys.modules`; `cuda()` lets `VLLMEngine` believe it has a GPU.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import torch


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=None, prompt_logprobs=None,
                 stop_token_ids=None, skip_special_tokens=True, seed=None):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": list(prompt_token_ids)}


class LLM:
    instances: list["LLM"] = []  # every engine built in this process

    def __init__(self, model: str, **kwargs):
        from transformers import AutoModelForCausalLM

        from exgrpo_core.rollout.vllm_engine import WeightSyncExtension

        LLM.instances.append(self)
        self.kwargs = kwargs
        hf = AutoModelForCausalLM.from_pretrained(model).eval().requires_grad_(False)
        hf.load_weights = lambda weights: _load(hf, weights)  # vLLM's loader takes HF names
        self.worker = type("Worker", (WeightSyncExtension,), {})()
        self.worker.model_runner = SimpleNamespace(model=hf)
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf.config))
        self.rpc_calls: list[str] = []
        self.asleep = False
        self.rng = torch.Generator().manual_seed(int(kwargs.get("seed", 0)))  # the engine's own stream
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    @property
    def model(self):
        return self.worker.model_runner.model

    def sleep(self, level: int = 1):
        assert self.kwargs.get("enable_sleep_mode") and level == 1 and not self.asleep
        self.asleep = True

    def wake_up(self):
        assert self.asleep
        self.asleep = False

    def collective_rpc(self, method: str, args=()):
        assert not self.asleep, f"{method} on a sleeping engine"
        self.rpc_calls.append(method)
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        return True

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm=False):
        assert not self.asleep, "generate on a sleeping engine"
        params = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for prompt, sp in zip(prompts, params):
            ids = prompt["prompt_token_ids"]
            self.prompts.append(ids)
            prompt_lp = None
            if sp.prompt_logprobs is not None:
                logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0, :-1].float(), -1)
                prompt_lp = [None] + [{t: SimpleNamespace(logprob=float(logp[i, t]))} for i, t in enumerate(ids[1:])]
            gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else self.rng  # as vLLM
            outputs = [self._sample(ids, sp, gen) for _ in range(sp.n)]
            outs.append(SimpleNamespace(outputs=outputs, prompt_logprobs=prompt_lp))
        return outs

    def _sample(self, ids, sp, gen):
        seq, toks, lps = list(ids), [], []
        for _ in range(sp.max_tokens):
            logp = torch.log_softmax(self.model(torch.tensor([seq])).logits[0, -1].float() / sp.temperature, -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            seq.append(tok)
            toks.append(tok)
            lps.append({tok: SimpleNamespace(logprob=float(logp[tok]))})
            if tok in (sp.stop_token_ids or []):
                break
        self.sampled.append(toks)
        finish = "stop" if toks and toks[-1] in (sp.stop_token_ids or []) else "length"
        return SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason=finish)


def _load(model, weights) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in weights:
            params[name].copy_(t)


def install() -> None:
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    vllm.LLM, vllm.SamplingParams, vllm.inputs, inputs.TokensPrompt = LLM, SamplingParams, inputs, TokensPrompt
    sys.modules["vllm"], sys.modules["vllm.inputs"] = vllm, inputs


@contextmanager
def cuda():
    """`VLLMEngine` believes it has a GPU (nothing else does)."""
    with mock.patch("exgrpo_core.rollout.vllm_engine.has_cuda", return_value=True):
        yield
