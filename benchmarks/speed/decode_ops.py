"""Operator calls and host synchronisations per decode step of a tiny grouped-query model, before / after.

    python benchmarks/speed/decode_ops.py --before-ref d656e3a

Decoders (the prefill runs before counting; each decodes the same seeded batch):
  before        rollout/decode.py at git ref `--before-ref` (float32 sampler, syncs every step)
  eager-1       the eager decoder, end checks and compaction after every step
  eager         the eager decoder at its default (every 16 steps)
  static        the static decoder's step (rollout/static_decode.py) run eagerly on a float32 copy, as
                on the CPU; on CUDA the same step is one CUDA-graph replay
Per step: ATen operator calls seen by torch.profiler (all, and those called from Python, i.e. with no
ATen parent) and host-syncing operators (`rollout/host_syncs.py`). Writes benchmarks/results/decode_ops_cpu.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from exgrpo_core.rollout import decode as current  # noqa: E402
from exgrpo_core.rollout.engine import left_padded  # noqa: E402
from exgrpo_core.observe.host_syncs import HostSyncCounter  # noqa: E402
from exgrpo_core.rollout.static_decode import InferenceCopy, StaticDecoder  # noqa: E402
from exgrpo_core.training.forward_parts import cache_of  # noqa: E402

TEXTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=", "9-4=", "8+8=")


def _before_decode(ref: str):
    """rollout/decode.py as it was at `ref`, loaded as a module of its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:exgrpo_core/rollout/decode.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "before_decode.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("before_decode", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["before_decode"] = mod
    spec.loader.exec_module(mod)
    return mod


def _count(run, model, steps_of):
    """(aten calls, top-level aten calls, host syncs, decode steps) of `run()`."""
    counter = HostSyncCounter()
    hook = model.register_forward_pre_hook(counter.mark)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof, counter:
            out = run()
    finally:
        hook.remove()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if not _aten_parent(e)]
    syncs = sum(len(s) for s in counter.per_step())
    return len(events), len(top), syncs, steps_of(out, counter)


def _aten_parent(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-ref", default="d656e3a", help="git ref of the decoder before (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt (8 prompts)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/decode_ops_cpu.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=0,
                             config_overrides={"num_key_value_heads": 2}).eval()
    eos = [tok.eos_token_id]
    prompts = [tok(t)["input_ids"] for t in TEXTS for _ in range(a.samples)]
    ids, mask = left_padded(prompts, tok.pad_token_id, torch.device("cpu"))
    pos = (mask[:, :-1].cumsum(-1) - 1).masked_fill(mask[:, :-1] == 0, 1)
    kw = dict(temperature=1.0, max_new_tokens=a.steps, eos_ids=eos, pad_id=tok.pad_token_id)

    def prefill():
        with torch.no_grad():
            return cache_of(model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos, use_cache=True))

    def eager(fn, **extra):
        def run():
            cache = prefill()  # counted: subtracted below as the first forward's share is not a step
            torch.manual_seed(0)
            return fn(model, ids, mask, cache, **kw, **extra)
        return run

    before = _before_decode(a.before_ref)
    modes = {"before": (eager(before.decode), model)}
    assert "compact_every" not in inspect.signature(before.decode).parameters or a.before_ref == "HEAD"
    modes["eager-1"] = (eager(current.decode, compact_every=1), model)
    modes["eager"] = (eager(current.decode), model)
    copy = InferenceCopy(torch.float32).refresh(model, torch.device("cpu"))
    static = StaticDecoder(compile_step=False)

    def run_static():
        torch.manual_seed(0)
        return static.decode(copy, ids, mask, **kw)
    modes["static"] = (run_static, copy)

    rows = {}
    for name, (run, m) in modes.items():
        run()  # warm-up
        # steps: forwards after the prefill one (eager modes prefill inside `run`, the static one too)
        total, top, syncs, steps = _count(run, m, lambda out, c: c.steps - 1)
        pre_total, pre_top, pre_syncs, _ = _count(prefill, model, lambda o, c: 0) if name != "static" else (0, 0, 0, 0)
        rows[name] = dict(steps=steps, aten_per_step=round((total - pre_total) / steps, 1),
                          top_level_aten_per_step=round((top - pre_top) / steps, 1),
                          host_syncs=syncs - pre_syncs, host_syncs_per_step=round((syncs - pre_syncs) / steps, 2))
        print(f"{name:8s} steps {steps:3d}  aten/step {rows[name]['aten_per_step']:7.1f}  "
              f"top-level/step {rows[name]['top_level_aten_per_step']:6.1f}  host syncs {rows[name]['host_syncs']:4d} "
              f"({rows[name]['host_syncs_per_step']:.2f}/step)", flush=True)
    result = dict(command="python benchmarks/speed/decode_ops.py --before-ref " + a.before_ref,
                  model="tiny Llama, hidden 64, 2 layers, 4 query / 2 key-value heads", rows=len(prompts),
                  steps=a.steps, torch=torch.__version__, loadavg_before=load_before,
                  loadavg_after=Path("/proc/loadavg").read_text().split()[:3], modes=rows,
                  note="static: its prefill is inside the count (one forward, its ops spread over the steps)")
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
