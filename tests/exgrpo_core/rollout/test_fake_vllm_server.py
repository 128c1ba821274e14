"""The `vllm serve` stand-in serves only what vLLM 0.33 has: its routes, request fields and response fields
are checked against vllm_contract.json (recorded from vLLM's source by scripts/vllm_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import fake_vllm_server as fake

C = json.loads((Path(__file__).resolve().parents[3] / "exgrpo_core" / "rollout" / "vllm_contract.json").read_text())


def _route(method: str, path: str) -> dict | None:
    return next((r for r in C["routes"] if r["method"] == method and r["path"] == path), None)


def _accepted(route: dict) -> set[str]:
    """Names a route reads: its parameters, or the fields of its request model."""
    out = set()
    for p in route["params"]:
        model = C["request_models"].get(p.get("model", ""))
        out |= set(model["fields"]) if model else {p["name"]}
    return out


def test_every_route_and_request_field_the_stand_in_serves_is_vllms():
    problems = []
    for (method, path), names in fake.ROUTES.items():
        route = _route(method, path)
        if route is None:
            problems.append(f"{method} {path}: not a route of vLLM {C['vllm_version']}")
            continue
        problems += [f"{method} {path}: vLLM reads no {n!r}" for n in names if n not in _accepted(route)]
    fields = lambda c: set(C["classes"][c]["fields"])  # noqa: E731
    problems += [f"SamplingParams has no {n!r}" for n in fake.SAMPLING_READ if n not in fields("SamplingParams")]
    problems += [f"NCCLWeightTransferInitInfo has no {n!r}" for n in fake.INIT_INFO
                 if n not in fields("NCCLWeightTransferInitInfo")]
    assert set(fake.UPDATE_INFO) == fields("NCCLWeightTransferUpdateInfo")
    assert not problems, "\n".join(problems)


def test_the_dev_routes_are_outside_the_api_keys_reach():
    """vLLM's --api-key guards these prefixes only (authenticate.py): the RL routes are open, as docs/scaling.md says."""
    rl = [r["path"] for r in C["routes"] if r["module"] == "vllm.entrypoints.rl.online.api_router"]
    assert "/update_weights" in rl and not any(p.startswith(fake.GUARDED_PREFIX) for p in rl)
    assert _route("POST", "/inference/v1/generate")["path"].startswith(fake.GUARDED_PREFIX)


def test_response_fields_are_vllms_output_fields(tmp_path):
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    srv = fake.FakeVLLMServer(build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64))
    try:
        out = srv.generate([1, 5, 6], {"n": 2, "max_tokens": 3, "logprobs": 0, "prompt_logprobs": 0})
    finally:
        srv.stop()
    choice_fields = set(C["classes"]["CompletionOutput"]["fields"])  # GenerateChoiceBase mirrors them
    assert set(out["choices"][0]) <= choice_fields, set(out["choices"][0]) - choice_fields
    assert "prompt_logprobs" in C["classes"]["RequestOutput"]["attributes"]
    assert [len(c["token_ids"]) for c in out["choices"]] == [len(c["logprobs"]["content"]) for c in out["choices"]]
