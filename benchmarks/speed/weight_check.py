"""Cost of the check after a remote push (rollout.engine=remote), against the `vllm serve` stand-in:

    python benchmarks/speed/weight_check.py --sizes 25 100 300 --repeats 3

Per model size (millions of parameters, bf16, a Llama-like layout: two norm weights per layer and a final
one), the seconds `RemoteEngine.checksums(norm names)` takes: `digests` (POST /weight_checker: sha256 of
every weight, as vLLM does; the former check) and `rpc` (POST /collective_rpc: float64 sums of the norm
weights only, in our worker extension). The stand-in runs on this CPU, so there is no device-to-host
copy: on a GPU server the digests cost more. Writes results/remote_weight_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "exgrpo_core" / "rollout"))

from fake_vllm_server import FakeVLLMServer, cpu_transfer  # noqa: E402

from exgrpo_core.rollout import sync as engine_sync  # noqa: E402
from exgrpo_core.rollout.remote import RemoteEngine  # noqa: E402

HIDDEN, LAYERS = 1024, 24


class Stack(torch.nn.Module):
    """Norm weights and one big matrix per layer, sized to `total` parameters."""

    def __init__(self, total: int):
        super().__init__()
        rows = max(1, (total - (2 * LAYERS + 1) * HIDDEN) // (LAYERS * HIDDEN))
        self.params = {}
        for i in range(LAYERS):
            for name, shape in ((f"model.layers.{i}.input_layernorm.weight", (HIDDEN,)),
                                (f"model.layers.{i}.mlp.up_proj.weight", (rows, HIDDEN)),
                                (f"model.layers.{i}.post_attention_layernorm.weight", (HIDDEN,))):
                self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.randn(shape, dtype=torch.bfloat16)))
                self.params[name] = name.replace(".", "_")
        self.register_parameter("model_norm_weight", torch.nn.Parameter(torch.ones(HIDDEN, dtype=torch.bfloat16)))
        self.params["model.norm.weight"] = "model_norm_weight"

    def named_parameters(self, *a, **k):  # the dotted names vLLM's models have
        return iter([(n, getattr(self, attr)) for n, attr in self.params.items()])


def measure(millions: int, repeats: int) -> dict:
    server = FakeVLLMServer(Stack(millions * 10**6))
    trainer = Stack(millions * 10**6)
    tok = SimpleNamespace(pad_token_id=0)
    eng = RemoteEngine(server.url, tok, params=[(n, tuple(p.shape)) for n, p in trainer.named_parameters()],
                       eos_ids=[0], weight_dtype=torch.bfloat16, open_transfer=cpu_transfer(server))
    try:
        eng.push_weights(trainer.named_parameters())
        names = engine_sync.norm_names(trainer)
        mine = engine_sync.trainer_checksums(trainer, names, torch.bfloat16)
        row = {"params_m": round(sum(p.numel() for _, p in trainer.named_parameters()) / 1e6, 1),
               "checked": len(names)}
        for mode, rpc in (("digests", False), ("rpc", True)):
            times = []
            for _ in range(repeats):
                eng.check_by_rpc, eng.workers = rpc, 1
                t0 = time.perf_counter()
                held = eng.checksums(names)
                times.append(time.perf_counter() - t0)
                assert not engine_sync.compare_checksums(mine, held), mode  # both pass on the same weights
            row[f"{mode}_s"] = round(statistics.median(times), 4)
        row["speedup"] = round(row["digests_s"] / row["rpc_s"], 1)
        return row
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 100, 300], help="millions of parameters")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "remote_weight_check.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [measure(m, args.repeats) for m in args.sizes]
    print(f"{'params (M)':>10} {'checked':>8} {'digests s':>10} {'rpc s':>8} {'speedup':>8}")
    for r in rows:
        print(f"{r['params_m']:>10} {r['checked']:>8} {r['digests_s']:>10} {r['rpc_s']:>8} {r['speedup']:>8}")
    out = {"command": "python benchmarks/speed/weight_check.py " + " ".join(sys.argv[1:]),
           "load_average": os.getloadavg(), "cpus": os.cpu_count(), "torch": torch.__version__, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
