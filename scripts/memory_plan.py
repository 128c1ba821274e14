"""Print the per-GPU memory plan of a run (Markdown), e.g. for configs/paper.yaml on 8 x 80 GB.

    python scripts/memory_plan.py                       # Qwen2.5-Math-7B, paper recipe
    python scripts/memory_plan.py --config-json path/to/config.json --world 8 --micro-batch-tokens 16384
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from exgrpo_core.training import memory_plan as mp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config-json", help="a Hugging Face config.json (default: Qwen2.5-Math-7B's shape)")
    ap.add_argument("--world", type=int, default=8, help="GPUs the FSDP shards span")
    ap.add_argument("--micro-batch-tokens", type=int, default=16384, help="tokens per forward/backward")
    ap.add_argument("--logits-chunk", type=int, default=1024, help="policy.py chunk_positions")
    ap.add_argument("--vllm-tp", type=int, default=2)
    ap.add_argument("--vllm-gpu-share", type=float, default=0.35)
    ap.add_argument("--gpu-gib", type=float, default=80.0)
    a = ap.parse_args()
    shape = mp.QWEN25_MATH_7B
    if a.config_json:
        with open(a.config_json) as f:
            shape = mp.ModelShape.from_hf_config(SimpleNamespace(**json.load(f)))
    plan = mp.memory_plan(shape, world=a.world, micro_batch_tokens=a.micro_batch_tokens,
                          logits_chunk=a.logits_chunk, vllm_tp=a.vllm_tp, vllm_gpu_share=a.vllm_gpu_share,
                          gpu_gib=a.gpu_gib)
    print(mp.render(plan))
    print()
    for k, v in plan.notes.items():
        print(f"- {k}: {v}")


if __name__ == "__main__":
    main()
