"""Host synchronisations per optimiser step of the training step on a CPU (the GPU-stall proxy of issue 32):
one `optimise` call over 8 rows of a tiny GQA model at 1, 4 and 8 micro-batches, for padded micro-batches
with and without prompt sharing and for packed ones, counted by `exgrpo_core/observe/host_syncs.py`.
Writes benchmarks/results/train_host_syncs.json and prints a table. `--old DIR`: run the same count on
another tree's exgrpo_core (e.g. `git archive <commit> exgrpo_core | tar -x -C DIR`, host_syncs.py copied in).

    python benchmarks/gpu/train_syncs.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def count() -> dict:
    import torch
    from accelerate import Accelerator

    from exgrpo_core.algorithm import losses
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
    from exgrpo_core.training.batch import collate
    from exgrpo_core.observe.host_syncs import counting
    from exgrpo_core.training.optimise import optimise
    from exgrpo_core.types import Rollout

    tok = build_tiny_tokenizer()
    has_pack = "pack" in inspect.signature(optimise).parameters
    out = {}
    for name, pack, share in [("padded, shared prompts", False, True), ("padded", False, False),
                              ("packed", True, False)]:
        if pack and not has_pack:
            continue
        row = {}
        for micro in (8, 2, 1):
            model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0,
                                     config_overrides={"num_key_value_heads": 2})
            g = torch.Generator().manual_seed(0)
            rows = []
            for i in range(8):
                resp = torch.randint(5, 40, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
                rows.append(Rollout(f"q{i // 4}", [1, 7 + i % 3, 9][:2 + i % 2], resp, [-2.0] * len(resp), "", False,
                                    0, replayed_from=5 if i % 4 == 3 else None))
            batch = collate(rows, [1.0, -1.0] * 4, tok.pad_token_id, [i // 4 for i in range(8)])
            with counting() as c:
                optimise(model, torch.optim.SGD(model.parameters(), lr=0.1), Accelerator(cpu=True), batch,
                         n_minibatches=1, micro_batch_size=micro,
                         onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                         replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="seq_sum_norm",
                         max_response_len=8, entropy_coef=0.01, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
                         skip_grad_norm=None, share_prompts=share, **({"pack": pack} if has_pack else {}))
            row[8 // micro] = c.total
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="a folder holding another tree's exgrpo_core")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(count()))
        return
    result = {"command": "python " + " ".join(sys.argv)}
    for label, path in [("now", str(ROOT))] + ([("old", args.old)] if args.old else []):
        proc = subprocess.run([sys.executable, __file__, "--child"], env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, cwd=path, check=True)
        result[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = ["| code | micro-batches | " + " | ".join(["1", "4", "8"]) + " |", "|---|---|---:|---:|---:|"]
    for label in ("old", "now"):
        for name, row in result.get(label, {}).items():
            lines.append(f"| {label} | {name} | " + " | ".join(str(row[str(k)] if str(k) in row else row[k])
                                                           for k in (1, 4, 8)) + " |")
    print("\n".join(lines))
    (ROOT / "benchmarks" / "results" / "train_host_syncs.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
