"""A stand-in for `vllm serve` (vLLM 0.33 with VLLM_SERVER_DEV_MODE=1 --enable-scale-out
--logprobs-mode processed_logprobs): exactly the routes RemoteEngine uses, with vLLM's request and response
field names, over a tiny Hugging Face model. `ROUTES` and the field names are checked against
vllm_contract.json in test_fake_vllm_server.py, so the stand-in cannot drift from vLLM.

Weights: vLLM's NCCL engine sends the tensors by broadcast while POST /update_weights names them; here
`cpu_transfer` (the trainer side, in place of remote.nccl_transfer) puts them on an in-process queue that
/update_weights reads in the order it was told, as vLLM's unpacked receive_weights does (nccl_engine.py).

POST /collective_rpc (vllm/entrypoints/serve/dev/rpc/api_router.py) calls `method` with the JSON `args` on
every worker of the first replica only (DPLBAsyncMPClient.call_utility_async returns the first engine's
answer) and answers {"results": [one per worker]}; a method the workers lack fails (HTTP 500). Our worker
extension (`exgrpo rollout-server` passes --worker-extension-cls) is mixed in unless `extension=False`.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import torch

# (method, path) -> body / query names read, from vllm_contract.json's routes (vllm/entrypoints/rl/online/api_router.py,
# vllm/entrypoints/scale_out/token_in_token_out/api_router.py, vllm/entrypoints/openai/models/api_router.py)
ROUTES = {("GET", "/v1/models"): (), ("GET", "/get_world_size"): ("include_dp",), ("POST", "/pause"): ("mode", "clear_cache"),
          ("POST", "/resume"): (), ("POST", "/init_weight_transfer_engine"): ("init_info",),
          ("POST", "/start_weight_update"): (), ("POST", "/update_weights"): ("update_info",),
          ("POST", "/finish_weight_update"): ("weight_version",), ("GET", "/weight_info"): (),
          ("POST", "/weight_checker"): ("action", "baseline"),
          ("POST", "/collective_rpc"): ("method", "args", "kwargs", "timeout"),
          ("POST", "/inference/v1/generate"): ("token_ids", "sampling_params")}
SAMPLING_READ = ("n", "temperature", "top_p", "max_tokens", "logprobs", "prompt_logprobs", "stop_token_ids", "detokenize")
INIT_INFO = ("master_address", "master_port", "rank_offset", "world_size", "packed")  # NCCLWeightTransferInitInfo
UPDATE_INFO = ("names", "dtype_names", "shapes")  # NCCLWeightTransferUpdateInfo
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")  # vllm/entrypoints/serve/middleware/authenticate.py:11


class FakeVLLMServer:
    """Serves `model` on 127.0.0.1; `stale=True` takes pushed tensors off the wire but never loads them."""

    def __init__(self, model, *, api_key: str | None = None, seed: int = 0, replicas: int = 1,
                 extension: bool = True):
        from exgrpo_core.rollout.vllm_engine import WeightSyncExtension

        self.model = model.eval().requires_grad_(False)
        base = (WeightSyncExtension, _Worker) if extension else (_Worker,)
        self.worker = type("Worker", base, {})(self.model)  # one per replica (tensor-parallel size 1)
        self.api_key, self.replicas, self.stale = api_key, replicas, False
        self.version, self.paused, self.updating, self.init_info = "default", False, False, None
        self.wire: queue.Queue = queue.Queue()
        self.gen = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, method: str, path: str, query: dict, body: dict):
        """(status, JSON answer) for one request."""
        self.requests.append((method, path))
        if (method, path) not in ROUTES:
            return 404, {"detail": "Not Found"}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
        if path == "/get_world_size":  # TP x PP x DP, or TP x PP with include_dp=false
            per_dp = query.get("include_dp", "true").lower() in ("false", "0", "no", "off")
            return 200, {"world_size": 1 if per_dp else self.replicas}
        if path == "/pause":
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/init_weight_transfer_engine":
            self.init_info = body["init_info"]
            return 200, {"message": "Weight transfer initialized"}
        if path == "/start_weight_update":
            self.updating = True
            return 200, {"message": "Weight update started"}
        if path == "/update_weights":
            return self._receive(body["update_info"])
        if path == "/finish_weight_update":
            self.updating = False
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return 200, {"message": "Weight update finished"}
        if path == "/weight_info":
            return 200, {"weight_version": self.version}
        if path == "/weight_checker":
            return 200, {"checksums": self.checksums()}
        if path == "/collective_rpc":
            return self._rpc(body)
        if self.paused:
            return 503, {"error": {"message": "generation is paused", "code": 503}}
        if not body.get("token_ids"):
            return 400, {"error": {"message": "token_ids: Field required", "code": 400}}
        with self.lock:
            return 200, self.generate(body["token_ids"], body["sampling_params"])

    @torch.no_grad()
    def _receive(self, info: dict):
        if not self.updating:
            return 500, {"error": "start_weight_update must be called before update_weights."}
        params = dict(self.model.named_parameters())
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
            got, tensor = self.wire.get(timeout=30)
            if got != name or list(tensor.shape) != list(shape) or str(tensor.dtype) != f"torch.{dtype}":
                return 500, {"error": f"broadcast of {got} does not match update_info's {name}"}
            if name not in params:
                return 500, {"error": f"KeyError: {name!r}"}  # what load_weights raises
            if not self.stale:
                params[name].copy_(tensor)
        return 200, {"message": "Weights updated"}

    def _rpc(self, body: dict):
        if body.get("method") is None:
            return 400, {"detail": "Missing 'method' in request body"}
        fn = getattr(self.worker, body["method"], None)
        if fn is None:
            return 500, {"detail": "Internal Server Error"}  # the worker's AttributeError
        with self.lock:
            result = fn(*body.get("args", []), **body.get("kwargs", {}))
        return 200, {"results": [result if result is None or isinstance(result, (dict, list)) else str(result)]}

    def checksums(self) -> dict[str, str]:
        """vLLM's per-worker digests (gpu_worker.py compute_weight_checksums, weight_checksum.py)."""
        return {f"dp{dp}:pp0:pcp0:tp0:{n}": hashlib.sha256(p.detach().contiguous().view(-1).view(torch.uint8).numpy())
                .hexdigest() for dp in range(self.replicas) for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def generate(self, prompt: list[int], sp: dict) -> dict:
        """A GenerateTokensResponse: `n` samples with processed (tempered, top-p) log-probs of the sampled tokens."""
        n, temp, top_p = int(sp.get("n", 1)), float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0))
        stop = set(sp.get("stop_token_ids") or []) | {int(self.model.config.eos_token_id)}
        choices = []
        for i in range(n):
            ids, content = list(prompt), []
            finish = "length"
            for _ in range(int(sp.get("max_tokens", 16))):
                logp = _processed(self.model(torch.tensor([ids])).logits[0, -1].float(), temp, top_p)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
                ids.append(tok)
                content.append({"token_id": tok, "logprob": float(logp[tok]), "rank": None, "top_logprobs": []})
                if tok in stop:
                    finish = "stop"
                    break
            out = ids[len(prompt):]
            choices.append({"index": i, "finish_reason": finish, "stop_reason": None, "token_ids": out,
                            "logprobs": {"content": content} if sp.get("logprobs") is not None else None,
                            "weight_versions": [{"version": self.version, "start": 0, "end": len(out)}]})
        prompt_lp = None
        if sp.get("prompt_logprobs") is not None:  # raw log-probs whatever the logprobs mode (config/model.py)
            logp = torch.log_softmax(self.model(torch.tensor([prompt])).logits[0].float(), -1)
            prompt_lp = [None] + [{str(t): {"logprob": float(logp[j, t]), "rank": None, "decoded_token": None}}
                                  for j, t in enumerate(prompt[1:])]
        return {"request_id": "generate-tokens-0", "output_mode": "tokens", "choices": choices,
                "prompt_logprobs": prompt_lp}


class _Worker:
    """What our worker extension uses of vLLM's GPU worker."""

    def __init__(self, model):
        self._model = model

    def get_model(self):
        return self._model


def _processed(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs after temperature and top-p (vLLM's processed_logprobs)."""
    logp = torch.log_softmax(logits / temperature, -1)
    if top_p < 1:
        p, order = logp.exp().sort(descending=True)
        drop = (p.cumsum(0) - p) > top_p
        logp = logp.clone()
        logp[order[drop]] = -float("inf")
        logp = torch.log_softmax(logp, -1)
    return logp


def cpu_transfer(server: FakeVLLMServer):
    """An `open_transfer` for RemoteEngine that drives the same calls as vLLM's NCCL trainer engine
    (init once; per push start -> update_weights alongside the "broadcast" -> finish), over the queue."""

    def open_transfer(client, params, dtype):
        client.init_weight_transfer_engine({"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                            "world_size": server.replicas + 1, "packed": False})

        def send(named):
            client.start_weight_update()
            info = {"names": [n for n, _ in params], "dtype_names": [str(dtype).removeprefix("torch.")] * len(params),
                    "shapes": [list(s) for _, s in params]}
            errors: list[Exception] = []
            worker = threading.Thread(target=lambda: _run(errors, client.update_weights, info))
            worker.start()
            for name, t in named:
                server.wire.put((name, t.detach().to(dtype).clone()))
            worker.join()
            if errors:
                raise errors[0]
            client.finish_weight_update()

        return SimpleNamespace(send=send, close=lambda: None)

    return open_transfer


def _run(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - handed back to the sending thread
        errors.append(e)


def _handler(server: FakeVLLMServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _serve(self, method: str):
            parts = urllib.parse.urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if parts.path.startswith(GUARDED_PREFIX) and server.api_key and \
                    self.headers.get("Authorization") != f"Bearer {server.api_key}":
                status, answer = 401, {"error": "Unauthorized"}
            else:
                status, answer = server.handle(method, parts.path, dict(urllib.parse.parse_qsl(parts.query)),
                                               json.loads(raw or b"{}"))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

    return Handler
