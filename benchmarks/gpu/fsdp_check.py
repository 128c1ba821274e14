"""Section (d) of benchmarks/gpu_check.sh (issue 31 on one device): FSDP2 on a one-process mesh holds no
unsharded float32 gradient accumulator between micro-batches (FSDP2's own state: each FSDPParam's
`unsharded_accumulated_grad` and its unsharded parameter's `.grad`, read by `fsdp.unsharded_grad_bytes`
after every micro-batch's backward), and the memory allocated after the optimiser step (gradients
freed) and at its peak against `training/memory_plan.py` for the same shape (world 1, no vLLM rows).
On a CPU the memory columns read "not measured". Writes fsdp_check.json.

    python benchmarks/gpu/fsdp_check.py [--tiny] [--out DIR]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.common import Report, parse, preset_config  # noqa: E402
from benchmarks.gpu.train_step import step_kwargs, synthetic_batch  # noqa: E402

GiB = 2**30


def main() -> None:
    args = parse(__doc__)
    import torch

    from exgrpo_core.run.session import open_session
    from exgrpo_core.training import fsdp, memory_plan as mp

    rep = Report("fsdp_check", args)
    questions, k, plen, resp = (2, 4, 8, 16) if args.tiny else (4, 8, 64, 512)
    micro = 2 if args.tiny else 8
    cfg = preset_config(args.tiny, ["train.sharding=fsdp2", "model.gradient_checkpointing=true",
                                    f"train.micro_batch_size={micro}", "train.micro_batch_tokens=16384",
                                    f"rollout.max_response_tokens={resp}"])
    s = open_session(cfg)
    gpu = torch.cuda.is_available()
    try:
        model = s.accelerator.unwrap_model(s.model)
        batch = synthetic_batch(s.tokenizer, questions, k, plen, resp)
        held, kinds = [], set()
        backward = s.accelerator.backward

        def watched(loss):  # after each micro-batch's backward: what FSDP2 keeps until the next one
            backward(loss)
            held.append(fsdp.unsharded_grad_bytes(model))
            for p in model.parameters():
                if p.grad is not None:
                    kinds.add(type(p.grad).__name__)

        s.accelerator.backward = watched
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if gpu else 0
        s.team.optimise(copy.copy(batch), **step_kwargs(cfg))
        s.accelerator.backward = backward
        after = torch.cuda.memory_allocated() if gpu else 0
        peak = torch.cuda.max_memory_allocated() if gpu else 0
        shape = mp.ModelShape.from_hf_config(model.config)
        lengths = batch.attention_mask.sum(-1).tolist()
        plan = mp.memory_plan(shape, world=1, micro_batch_tokens=min(cfg.train.micro_batch_tokens,
                                                                     micro * max(lengths)))
        state = {k: v for k, v in plan.phases["sampling"].items() if not k.startswith("vLLM")}
        train = {k: v for k, v in plan.phases["optimiser step"].items() if not k.startswith("vLLM")}
        whole = sum(p.numel() * 4 for p in model.parameters())
        rep.add("accumulation", {
            "micro_batches": len(held), "unsharded_grad_bytes_after_each_backward": held,
            "whole_fp32_gradient_bytes": whole, "no_unsharded_accumulator": bool(held) and max(held) == 0,
            "grad_types": sorted(kinds)})
        measured = {"allocated_before_step_gib": before / GiB, "allocated_after_step_gib": after / GiB,
                    "peak_during_step_gib": peak / GiB} if gpu else "not measured (no CUDA)"
        rep.add("memory", {"measured": measured, "plan_after_step_gib": sum(state.values()),
                           "plan_step_peak_gib": sum(train.values()), "plan_rows_after_step": state,
                           "plan_rows_step": train,
                           "after_over_plan": (after / GiB / sum(state.values())) if gpu else None,
                           "peak_over_plan": (peak / GiB / sum(train.values())) if gpu else None})
    finally:
        s.close()
    rep.done()


if __name__ == "__main__":
    main()
