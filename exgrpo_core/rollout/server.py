"""A rollout server for a dedicated rollout node (`exgrpo rollout-server`), used by `rollout.engine=remote`.

The server owns a rollout engine with its own copy of the weights: vLLM on a GPU node, or the
transformers engine (CPU or GPU; what the tests run). The trainer's `RemoteEngine`
(rollout_remote.py) talks to it over HTTP:

    GET  /health      model, backend, dtype, EOS / pad ids, weight version (pushes so far)
    POST /generate    JSON {prompts, counts, temperature, max_new_tokens, seed} -> generations
    POST /weights     a safetensors body: named tensors loaded in place (sent in chunks); -> {loaded, version}
    POST /checksums   JSON {names} -> {name: float64 sum}     (engine_sync checks them after a push)
    POST /probe       JSON {token_ids} -> {logprobs}         (the log-prob probe of engine_sync)
    POST /group       JSON {host, port, backend} -> join the trainer's two-member weight group
    POST /weights_stream  JSON {seq, tensors: [[name, shape, dtype]...]} -> the tensors arrive by
                      broadcast in the weight group (weight_group.py); -> {loaded, version}

One request runs at a time (the engine is not thread-safe); a bad request gets a 400 with the
problem named, an engine failure a 500; neither stops the server.
"""

from __future__ import annotations

import json
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from safetensors.torch import load as load_safetensors

from exgrpo_core.rollout import weight_group
from exgrpo_core.rollout.engine import TransformersEngine, sample_counts


class RequestError(ValueError):
    """A request the server cannot serve (named in the 400 response)."""


class TransformersBackend:
    """The transformers engine on the server's own model copy, with weight loading by name."""

    backend = "transformers"

    def __init__(self, model, tokenizer, *, batch_size: int = 64, top_p: float = 1.0):
        self.model = model.eval().requires_grad_(False)
        self.engine = TransformersEngine(model, tokenizer, top_p=top_p, batch_size=batch_size)
        self.params = dict(model.named_parameters())
        self.dtype = next(model.parameters()).dtype

    def generate(self, prompts, counts, *, temperature, max_new_tokens, seed):
        if seed is not None:
            torch.manual_seed(seed)
        return self.engine.generate(prompts, counts, temperature=temperature, max_new_tokens=max_new_tokens)

    @torch.no_grad()
    def load(self, tensors: dict[str, torch.Tensor]) -> int:
        check_shapes(self, ((n, t.shape) for n, t in tensors.items()))
        for n, t in tensors.items():
            self.params[n].copy_(t)
        return len(tensors)

    def checksums(self, names: list[str]) -> dict[str, float]:
        return {n: float(self.params[n].double().sum()) for n in names if n in self.params}

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The named parameter's shape, None if the model has no such parameter."""
        return tuple(self.params[name].shape) if name in self.params else None

    def probe(self, token_ids: list[int]) -> list[float]:
        from exgrpo_core.rollout.sync import trainer_probe

        return trainer_probe(self.model, token_ids)


class VLLMBackend:
    """vLLM (`rollout_vllm.VLLMEngine`) behind the same calls."""

    backend = "vllm"

    def __init__(self, engine, dtype: torch.dtype, shapes: dict[str, tuple[int, ...]]):
        self.engine, self.dtype, self.shapes = engine, dtype, shapes  # shapes: the Hugging Face model's

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def generate(self, prompts, counts, *, temperature, max_new_tokens, seed):
        if seed is not None:  # the engine draws each request's seed from torch's RNG
            torch.manual_seed(seed)
        return self.engine.generate(prompts, counts, temperature=temperature, max_new_tokens=max_new_tokens)

    def load(self, tensors: dict[str, torch.Tensor]) -> int:
        check_shapes(self, ((n, t.shape) for n, t in tensors.items()))
        return self.engine.push_weights(tensors.items())

    def checksums(self, names):
        return self.engine.checksums(names)

    def probe(self, token_ids):
        return self.engine.probe(token_ids)


def check_shapes(backend, named_shapes) -> None:
    """Refuse (RequestError) a tensor the backend's model does not have, or has in another shape."""
    for name, shape in named_shapes:
        ours = backend.shape(name)
        if ours is None:
            raise RequestError(f"unknown parameter name {name!r}")
        if tuple(shape) != ours:
            raise RequestError(f"{name}: shape {tuple(shape)}, the server's is {ours}")


def _generation_json(g) -> dict:
    return {"response_ids": g.response_ids, "logprobs": g.logprobs, "text": g.text, "truncated": g.truncated,
            "entropies": g.entropies}


class RolloutServer:
    """Serves one backend; `start()` runs it in a thread (tests), `serve_forever()` in the foreground."""

    def __init__(self, backend, tokenizer, *, model_name: str, host: str = "127.0.0.1", port: int = 8009):
        self.backend, self.tokenizer, self.model_name = backend, tokenizer, model_name
        self.version = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.thread: threading.Thread | None = None
        self.pair = None  # the weight group (weight_group.Pair) once a trainer asked for one

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def health(self) -> dict:
        eng = getattr(self.backend, "engine", None)
        return {"model": self.model_name, "backend": self.backend.backend, "dtype": str(self.backend.dtype),
                "eos_ids": list(eng.eos_ids), "pad_id": int(eng.pad_id), "version": self.version}

    def handle(self, path: str, body: bytes) -> Any:
        if path == "/weights":
            try:
                tensors = load_safetensors(body)
            except Exception as e:  # noqa: BLE001 - safetensors raises its own errors
                raise RequestError(f"the body is not a safetensors payload: {e}") from e
            with self.lock:
                loaded = self.backend.load(tensors)
                self.version += 1
            return {"loaded": loaded, "version": self.version}
        try:
            req = json.loads(body or b"{}")
        except json.JSONDecodeError as e:
            raise RequestError(f"the body is not JSON: {e}") from e
        with self.lock:
            if path == "/generate":
                prompts = req.get("prompts")
                if not isinstance(prompts, list) or not all(isinstance(p, list) and p for p in prompts):
                    raise RequestError("prompts must be a list of non-empty token id lists")
                counts = sample_counts(prompts, req.get("counts", 1))
                top_p = float(req.get("top_p", 1.0))
                if not 0 < top_p <= 1:
                    raise RequestError(f"top_p must be in (0, 1], got {top_p}")
                self.backend.engine.top_p = top_p
                gens = self.backend.generate(prompts, counts, temperature=float(req["temperature"]),
                                             max_new_tokens=int(req["max_new_tokens"]), seed=req.get("seed"))
                return {"generations": [[_generation_json(g) for g in group] for group in gens],
                        "version": self.version}
            if path == "/group":
                self.pair = weight_group.open_pair(str(req["host"]), int(req["port"]), 1, str(req["backend"]),
                                                   float(req.get("timeout_s", 600)))
                return {"joined": True, "version": self.version}
            if path == "/weights_stream":
                return self._receive(int(req["seq"]), req["tensors"])
            if path == "/checksums":
                return self.backend.checksums(list(req.get("names", [])))
            if path == "/probe":
                return {"logprobs": self.backend.probe([int(t) for t in req["token_ids"]])}
        raise RequestError(f"no such endpoint: POST {path}")

    def _receive(self, seq: int, specs: list) -> dict:
        """Check a chunk's names, shapes and dtypes, tell the trainer (store key), take the broadcasts."""
        if self.pair is None:
            raise RequestError("no weight group: the trainer must POST /group first")
        key = f"chunk/{seq}"
        try:
            check_shapes(self.backend, ((name, shape) for name, shape, _ in specs))
            buffers = {name: torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=self.pair.device)
                       for name, shape, dtype in specs}
        except (RequestError, ValueError, TypeError, AttributeError) as e:
            self.pair.store.set(key, f"refused: {e}")
            raise RequestError(str(e)) from e
        self.pair.store.set(key, "ok")
        for t in buffers.values():
            weight_group.broadcast(self.pair, t)
        loaded = self.backend.load(buffers)
        self.version += 1
        return {"loaded": loaded, "version": self.version}

    def start(self) -> "RolloutServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: RolloutServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: one line per request is noise at a request per step
            pass

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._reply(200, server.health())
            else:
                self._reply(404, {"error": f"no such endpoint: GET {self.path}"})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                self._reply(200, server.handle(self.path, body))
            except (RequestError, KeyError, TypeError, ValueError) as e:
                msg = f"missing field {e}" if isinstance(e, KeyError) else str(e)
                self._reply(404 if "no such endpoint" in msg else 400, {"error": msg})
            except Exception as e:  # noqa: BLE001 - the server keeps running; the client sees the cause
                traceback.print_exc()
                self._reply(500, {"error": f"{type(e).__name__}: {e}"})

    return Handler


def build_backend(model: str, backend: str, *, dtype: str = "float32", batch_size: int = 64,
                  tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                  work_dir: str | None = None):
    """(backend, tokenizer) for `exgrpo rollout-server`: the model by name or path, as the trainer loads it."""
    from exgrpo_core.models import load as models

    policy, tokenizer = models.load_policy(model, dtype=dtype, tiny={}, seed=0)
    if backend == "transformers":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return TransformersBackend(policy.to(device), tokenizer, batch_size=batch_size), tokenizer
    if backend != "vllm":
        raise ValueError(f"unknown rollout-server backend {backend!r}: use transformers or vllm")
    import os
    import tempfile

    from exgrpo_core.rollout.vllm_engine import VLLMEngine

    path = model
    if not os.path.isdir(model):  # GGUF / built locally: give vLLM a plain Hugging Face folder
        path = os.path.join(work_dir or tempfile.mkdtemp(prefix="exgrpo-rollout-"), "base")
        policy.save_pretrained(path)
        tokenizer.save_pretrained(path)
    engine = VLLMEngine(path, tokenizer, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)
    shapes = {n: tuple(p.shape) for n, p in policy.named_parameters()}
    return VLLMBackend(engine, getattr(torch, dtype), shapes), tokenizer
