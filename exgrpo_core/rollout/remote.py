"""`rollout.engine=remote`: sample on a rollout server (rollout_server.py) on another node.

`RemoteEngine` has the calls of the colocated engines: `generate` (same `Generation` records),
`push_weights` (the trainer's named tensors in chunks of at most `chunk_bytes`: safetensors bodies,
or broadcasts in a two-member process group with the server, weight_group.py),
`checksums` and `probe` (engine_sync checks every push with them). Sampling seeds come from the
trainer's torch RNG, so a resumed run asks the server for the same draws.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, Iterable

import torch
from safetensors.torch import save as save_safetensors

from exgrpo_core.rollout import weight_group
from exgrpo_core.rollout.engine import sample_counts, weight_chunks
from exgrpo_core.types import Generation


class RemoteEngineError(RuntimeError):
    """The rollout server could not be reached or refused a request."""


class RemoteEngine:
    shared_by_processes = True  # several training processes sample on one server; rank 0 pushes
    def __init__(self, url: str, tokenizer, *, top_p: float = 1.0, timeout_s: float = 600.0,
                 chunk_bytes: int = 512 << 20, transport: str = "http", group_host: str | None = None):
        self.url = url.rstrip("/")
        self.transport, self.group_host, self.pair, self.seq = transport, group_host, None, 0
        self.top_p = top_p
        self.batch_size = None  # the server batches; kept so evaluation settings can be applied alike
        self.tokenizer, self.timeout_s, self.chunk_bytes = tokenizer, timeout_s, chunk_bytes
        info = self._call("GET", "/health")
        self.server = info
        self.eos_ids = [int(t) for t in info["eos_ids"]]
        self.pad_id = int(info["pad_id"])
        self.weight_dtype = getattr(torch, str(info["dtype"]).removeprefix("torch."))
        tok_eos = tokenizer.eos_token_id
        if tok_eos is not None and int(tok_eos) not in self.eos_ids:
            raise RemoteEngineError(f"the rollout server at {self.url} serves {info['model']!r}, whose EOS ids "
                                    f"{self.eos_ids} do not include this tokenizer's EOS {tok_eos}: a different model?")

    def _call(self, method: str, path: str, payload: Any = None, raw: bytes | None = None) -> Any:
        data = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                why = json.loads(e.read()).get("error", "")
            except (ValueError, AttributeError):
                why = ""
            raise RemoteEngineError(f"rollout server {self.url}{path}: HTTP {e.code}: {why}") from e
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RemoteEngineError(f"rollout server at {self.url} is not reachable ({reason}); start it with "
                                    "`exgrpo rollout-server` or check rollout.server_url") from e

    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int) -> list[list[Generation]]:
        counts = sample_counts(prompts, n)
        seed = int(torch.randint(0, 2**62, (1,)))
        out = self._call("POST", "/generate", {"prompts": prompts, "counts": counts, "temperature": temperature,
                                                "max_new_tokens": max_new_tokens, "seed": seed, "top_p": self.top_p})
        groups = out["generations"]
        if [len(g) for g in groups] != counts:
            raise RemoteEngineError(f"rollout server returned {[len(g) for g in groups]} generations, asked {counts}")
        return [[Generation(response_ids=g["response_ids"], logprobs=g["logprobs"], text=g["text"],
                            truncated=g["truncated"], entropies=g.get("entropies") or [])
                 for g in group] for group in groups]

    def push_weights(self, named_params: Iterable[tuple[str, Any]]) -> int:
        """Send every named tensor (in the server's dtype) in chunks; returns tensors loaded."""
        if self.transport != "http":
            return self._broadcast_push(named_params)
        prepare = lambda t: t.to("cpu", self.weight_dtype).contiguous()  # noqa: E731
        return sum(self._send(dict(chunk)) for chunk in weight_chunks(named_params, self.chunk_bytes, prepare))

    def _send(self, tensors: dict[str, torch.Tensor]) -> int:
        tied = {}  # safetensors refuses shared storage (tied embeddings): send independent copies
        seen: set[int] = set()
        for n, t in tensors.items():
            ptr = t.untyped_storage().data_ptr()
            tied[n] = t.clone() if ptr in seen else t
            seen.add(ptr)
        return int(self._call("POST", "/weights", raw=save_safetensors(tied))["loaded"])

    def _open_pair(self) -> weight_group.Pair:
        """Start the weight group's store here and have the server join it (weight_group.py)."""
        host = self.group_host or weight_group.address_towards(self.url)
        port = weight_group.free_port()
        answer: dict = {}
        asked = threading.Thread(target=self._call_into, args=(answer, "/group", {
            "host": host, "port": port, "backend": self.transport, "timeout_s": self.timeout_s}))
        asked.start()
        try:
            pair = weight_group.open_pair(host, port, 0, self.transport, self.timeout_s)
        except (RuntimeError, ValueError) as e:  # torch's DistNetworkError / DistStoreError, a bad backend
            asked.join()
            raise RemoteEngineError(
                f"the weight group with the rollout server at {host}:{port} ({self.transport}) could not be formed: "
                f"{str(e).splitlines()[0]}; set rollout.server_group_host to an address of this machine the "
                "server can reach, or use rollout.server_weight_transport=http") from e
        asked.join()
        if "error" in answer:
            raise answer["error"]
        return pair

    def _call_into(self, answer: dict, path: str, payload: dict) -> None:
        try:
            answer.update(self._call("POST", path, payload))
        except RemoteEngineError as e:
            answer["error"] = e

    def _broadcast_push(self, named_params) -> int:
        """Each chunk: its names, shapes and dtypes over HTTP, then (once the server said ok) the tensors by broadcast."""
        self.pair = self.pair or self._open_pair()
        prepare = lambda t: t.to(self.pair.device, self.weight_dtype).contiguous()  # noqa: E731
        loaded = 0
        for chunk in weight_chunks(named_params, self.chunk_bytes, prepare):
            self.seq += 1
            specs = [[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in chunk]
            answer: dict = {}
            asked = threading.Thread(target=self._call_into, args=(answer, "/weights_stream",
                                                                   {"seq": self.seq, "tensors": specs}))
            asked.start()
            if weight_group.wait_for(self.pair, f"chunk/{self.seq}", asked.is_alive) == "ok":
                for _, t in chunk:
                    weight_group.broadcast(self.pair, t)
            asked.join()
            if "error" in answer:
                raise answer["error"]
            loaded += int(answer["loaded"])
        return loaded

    def checksums(self, names: list[str]) -> dict[str, float]:
        return {k: float(v) for k, v in self._call("POST", "/checksums", {"names": names}).items()}

    def probe(self, token_ids: list[int]) -> list[float]:
        return [float(x) for x in self._call("POST", "/probe", {"token_ids": list(token_ids)})["logprobs"]]
