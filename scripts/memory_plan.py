"""Print the per-GPU memory plan of a run by phase (Markdown), e.g. for configs/paper.yaml on 8 x 80 GB.

    python scripts/memory_plan.py                       # the paper preset: Qwen2.5-Math-7B's shape, 8 GPUs
    python scripts/memory_plan.py --set rollout.vllm_sleep=false --unsharded-grad-accumulation   # the plan before
    python scripts/memory_plan.py --config-json path/to/config.json --world 8
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from exgrpo_core.config.load import load_config
from exgrpo_core.training import memory_plan as mp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="paper", help="preset or YAML: micro-batch tokens and the vLLM settings")
    ap.add_argument("--set", action="append", default=[], help="dotted.key=value override of the preset")
    ap.add_argument("--config-json", help="a Hugging Face config.json (default: Qwen2.5-Math-7B's shape)")
    ap.add_argument("--world", type=int, default=8, help="GPUs the FSDP shards span")
    ap.add_argument("--logits-chunk", type=int, default=1024, help="policy.py chunk_positions")
    ap.add_argument("--gpu-gib", type=float, default=80.0)
    ap.add_argument("--unsharded-grad-accumulation", action="store_true",
                    help="count whole fp32 gradients kept between micro-batches (gradient sync off)")
    a = ap.parse_args()
    cfg = load_config(a.config, a.set)
    shape = mp.QWEN25_MATH_7B
    if a.config_json:
        with open(a.config_json) as f:
            shape = mp.ModelShape.from_hf_config(SimpleNamespace(**json.load(f)))
    tokens = cfg.train.micro_batch_tokens or cfg.train.micro_batch_size * (
        cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)
    plan = mp.memory_plan(shape, world=a.world, micro_batch_tokens=tokens, logits_chunk=a.logits_chunk,
                          vllm_tp=cfg.rollout.vllm_tensor_parallel_size,
                          vllm_gpu_share=cfg.rollout.vllm_gpu_memory_utilization, gpu_gib=a.gpu_gib,
                          vllm_sleep=cfg.rollout.vllm_sleep, unsharded_grad_accumulation=a.unsharded_grad_accumulation)
    print(mp.render(plan))
    print()
    for k, v in plan.notes.items():
        print(f"- {k}: {v}")


if __name__ == "__main__":
    main()
