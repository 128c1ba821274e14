"""Print the per-GPU memory plan of a run by phase (Markdown), e.g. for configs/paper.yaml on 8 x 80 GB.

    python scripts/memory_plan.py                       # the paper preset: Qwen2.5-Math-7B's shape, 8 GPUs
    python scripts/memory_plan.py --set rollout.vllm_sleep=false --unsharded-grad-accumulation   # the plan before
    python scripts/memory_plan.py --config-json path/to/config.json --world 8
    python scripts/memory_plan.py --world 16 --gpus-per-machine 8     # two machines: HSDP shards over 8 GPUs

With HSDP (train.hsdp, train.shard_size; fsdp.mesh_shape decides as the run does) the weights, gradients
and AdamW moments are sharded over one shard group, not over every GPU: the sharded rows divide by it.
`auto` layout values (train.sharding, model.gradient_checkpointing, train.pack_sequences) are resolved as
the run would on these GPUs with this torch; packed micro-batches hold no padding mask or shared prompts.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from exgrpo_core.config.load import load_config
from exgrpo_core.run import layout_choice
from exgrpo_core.training import fsdp, memory_plan as mp


def resolved(cfg, world: int, shape: mp.ModelShape = mp.QWEN25_MATH_7B, gpu_gib: float = 80.0,
             varlen: bool | None = None) -> layout_choice.Choice:
    """The run's layout (sharding, checkpointing, packing): `auto` values as the run would resolve them on
    `world` GPUs of `gpu_gib` GiB (`varlen`: torch has varlen_attn; None: this torch), explicit ones kept."""
    got = layout_choice.decide(cfg, gpus=world, gpu_gib=gpu_gib, shape=lambda: shape, varlen=varlen)
    return got or layout_choice.Choice(cfg.train.sharding, bool(cfg.model.gradient_checkpointing), "explicit",
                                       bool(cfg.train.pack_sequences))


def shard_group(cfg, world: int, gpus_per_machine: int, shape: mp.ModelShape = mp.QWEN25_MATH_7B,
                gpu_gib: float = 80.0) -> int:
    """GPUs one sharded copy spans: the last dimension of the run's FSDP2 mesh (all `world` without HSDP);
    with train.sharding=auto, as the run would resolve it on `world` GPUs of `gpu_gib` GiB."""
    sharding = resolved(cfg, world, shape, gpu_gib).sharding
    if sharding != "fsdp2":
        return 1  # replicated: every GPU holds the whole model, gradients and moments
    return fsdp.mesh_shape(cfg.train.hsdp, world, min(gpus_per_machine, world), cfg.train.shard_size)[-1]


def plan_for(cfg, shape: mp.ModelShape, *, world: int, gpus_per_machine: int, logits_chunk: int = 1024,
             gpu_gib: float = 80.0, unsharded_grad_accumulation: bool = False, varlen: bool | None = None) -> mp.Plan:
    """The per-GPU plan of run config `cfg` on `world` GPUs, `gpus_per_machine` to a machine."""
    tokens = layout_choice.micro_batch_tokens(cfg)
    row = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    group = shard_group(cfg, world, gpus_per_machine, shape, gpu_gib)
    lay = resolved(cfg, world, shape, gpu_gib, varlen)
    # prompt sharing runs only on replicated weights without checkpointing (forward_parts.can_share_prompts)
    share = cfg.train.share_prompt_forward and lay.sharding == "replicate" and not lay.gradient_checkpointing
    shared = cfg.train.micro_batch_size * cfg.rollout.max_prompt_tokens if share else 0
    return mp.memory_plan(shape, world=group, micro_batch_tokens=tokens, packed=lay.pack_sequences,
                          row_tokens=row, shared_prompt_tokens=shared,
                          logits_chunk=logits_chunk, vllm_tp=cfg.rollout.vllm_tensor_parallel_size,
                          vllm_gpu_share=cfg.rollout.vllm_gpu_memory_utilization, gpu_gib=gpu_gib,
                          vllm_sleep=cfg.rollout.vllm_sleep, unsharded_grad_accumulation=unsharded_grad_accumulation)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="paper", help="preset or YAML: micro-batch tokens and the vLLM settings")
    ap.add_argument("--set", action="append", default=[], help="dotted.key=value override of the preset")
    ap.add_argument("--config-json", help="a Hugging Face config.json (default: Qwen2.5-Math-7B's shape)")
    ap.add_argument("--world", type=int, default=8, help="GPUs of the run, all machines together")
    ap.add_argument("--gpus-per-machine", type=int, default=8, help="HSDP: a shard group per machine")
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
    try:
        plan = plan_for(cfg, shape, world=a.world, gpus_per_machine=a.gpus_per_machine, logits_chunk=a.logits_chunk,
                        gpu_gib=a.gpu_gib, unsharded_grad_accumulation=a.unsharded_grad_accumulation)
    except ValueError as err:
        raise SystemExit(f"memory_plan: {err}") from None
    print(mp.render(plan))
    print()
    print(f"- shard_group: {shard_group(cfg, a.world, a.gpus_per_machine, shape, a.gpu_gib)} of {a.world} GPUs")
    for k, v in plan.notes.items():
        print(f"- {k}: {v}")


if __name__ == "__main__":
    main()
