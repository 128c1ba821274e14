"""Section (c) of benchmarks/gpu_check.sh: the training step's model FLOPs utilisation (MFU) and hardware
FLOPs utilisation (HFU) on the real-shape preset, before and after each change of issue 32 item 3.

Variants, each a session opened with its overrides (cumulative, so each row adds one change):
  before: FSDP2 on one GPU + gradient checkpointing + right-padded micro-batches (the gpu-0.5b layout);
  +replicate: the whole model on the one GPU (no FSDP2 gathers);
  +no-checkpointing: activations kept (no recomputed forward);
  +packed: padding-free packed micro-batches (`train.pack_sequences`), when the schema has it.
MFU = useful model FLOPs (training/flops.py, PaLM's convention) / synchronised seconds / dense bf16 peak;
HFU counts what ran: padding (executed / useful tokens of the micro-batch plan) and, with
checkpointing, the recomputed forward (8N instead of 6N per token). Host syncs per optimiser step are
counted over one call (`host_syncs.HostSyncCounter`). The last variant's call is profiled, its top
operators also grouped by input shape (which tensors the time goes to). Writes train_step.json.

    python benchmarks/gpu/train_step.py [--tiny] [--out DIR] [--variants +packed]
    (gpu_check.sh passes TRAIN_STEP_VARIANTS as --variants when set)
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.common import Report, cuda_kernels, parse, peak_tflops, preset_config, sync  # noqa: E402

VARIANTS = [("before", ["model.gradient_checkpointing=true", "train.sharding=fsdp2", "train.pack_sequences=false"]),
            ("+replicate", ["model.gradient_checkpointing=true", "train.sharding=replicate",
                            "train.pack_sequences=false"]),
            ("+no-checkpointing", ["model.gradient_checkpointing=false", "train.sharding=replicate",
                                   "train.pack_sequences=false"]),
            ("+packed", ["model.gradient_checkpointing=false", "train.sharding=replicate", "train.pack_sequences=true"])]


def has_packing() -> bool:
    from exgrpo_core.config.schema import TrainConfig

    return "pack_sequences" in TrainConfig.model_fields


def synthetic_batch(tok, questions: int, k: int, prompt_len: int, max_response: int, seed: int = 0):
    """K responses per question, response lengths uniform in [max/16, max] (random tokens), as `collate` packs them."""
    from exgrpo_core.training.batch import collate
    from exgrpo_core.types import Rollout

    rng = random.Random(seed)
    rows, advs, qidx = [], [], []
    for q in range(questions):
        prompt = [rng.randrange(10, len(tok)) for _ in range(prompt_len)]
        for j in range(k):
            t = rng.randint(max(1, max_response // 16), max_response)
            rows.append(Rollout(f"q{q}", prompt, [rng.randrange(10, len(tok)) for _ in range(t)],
                                [-2.0] * t, "", t == max_response, 0))
            advs.append(1.0 if j % 2 else -1.0)
            qidx.append(q)
    return collate(rows, advs, tok.pad_token_id, qidx)


def step_kwargs(cfg) -> dict:
    from exgrpo_core.algorithm import losses

    return dict(n_minibatches=1, micro_batch_size=cfg.train.micro_batch_size,
                micro_batch_tokens=cfg.train.micro_batch_tokens,
                onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=cfg.loss.clip_eps),
                replay_term=partial(losses.shaped_replay_term, beta=cfg.loss.shaping_beta),
                aggregation=cfg.loss.aggregation, max_response_len=cfg.rollout.max_response_tokens,
                entropy_coef=cfg.loss.entropy_coef, kl_coef=0.0, temperature=cfg.rollout.temperature,
                max_grad_norm=cfg.train.max_grad_norm, skip_grad_norm=None,
                entropy_micro_tokens=cfg.loss.entropy_micro_tokens)


def executed_tokens(batch, size: int, max_tokens: int | None, packed: bool) -> int:
    """Tokens the forward runs (`packing.executed_tokens`) under optimise's micro-batch plan (without
    prompt sharing, which the benchmark's distinct prompts would not use much)."""
    from exgrpo_core.training import packing
    from exgrpo_core.training.batch import micro_batch_rows

    lengths = batch.attention_mask.sum(-1).tolist()
    plan = packing.micro_batches(lengths, size, max_tokens) if packed else micro_batch_rows(batch, size, max_tokens)
    return packing.executed_tokens(lengths, plan, packed)


def layout_rule(tiny: bool) -> dict:
    """What `training/layout.py` picks for the preset on this device (one GPU; 80 GiB on a CPU)."""
    import dataclasses

    import torch

    from exgrpo_core.models.load import policy_config
    from exgrpo_core.training.layout import train_layout
    from exgrpo_core.training.memory_plan import ModelShape

    cfg = preset_config(tiny)
    c = policy_config(cfg.model.name_or_path, tiny=cfg.model.tiny.model_dump(), hf_overrides=cfg.model.hf_overrides)
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    got = train_layout(ModelShape.from_hf_config(c), gpus=1, gpu_gib=gib, micro_batch_tokens=cfg.train.micro_batch_tokens)
    return {**dataclasses.asdict(got), "gpu_gib": gib, "preset_sets": {
        "sharding": cfg.train.sharding, "gradient_checkpointing": cfg.model.gradient_checkpointing}}


def profile_call(call) -> dict:
    """One call under torch.profiler: wall ms, GPU-busy ms, kernel count and the kernels taking most GPU time
    (on a CPU: the operators taking most CPU time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    t0 = time.perf_counter()
    with torch_profile(activities=acts, record_shapes=True) as prof:
        call()
        sync()
    wall = time.perf_counter() - t0
    kernels, busy = cuda_kernels(prof)
    key = (lambda a: a.self_device_time_total) if cuda else (lambda a: a.self_cpu_time_total)
    top = sorted(prof.key_averages(), key=lambda a: -key(a))[:12]
    shaped = sorted((a for a in prof.key_averages(group_by_input_shape=True) if a.key.startswith("aten::")),
                    key=lambda a: -key(a))[:16]
    return {"wall_ms": wall * 1e3, "gpu_busy_ms": busy, "kernels": len(kernels),
            "top": [{"name": a.key[:160], "calls": a.count, "ms": key(a) / 1e3} for a in top],
            "top_by_shape": [{"name": a.key, "shapes": str(a.input_shapes)[:200], "calls": a.count,
                              "ms": key(a) / 1e3} for a in shaped]}


def main() -> None:
    args = parse(__doc__, lambda ap: ap.add_argument(
        "--variants", default=os.environ.get("TRAIN_STEP_VARIANTS", ""),
        help="comma-separated variant names to run (default: all)"))
    import copy

    import torch

    from exgrpo_core.run.session import open_session
    from exgrpo_core.training.flops import model_train_flops
    from exgrpo_core.observe.host_syncs import counting

    rep = Report("train_step", args)
    peak = peak_tflops()
    questions, k, plen, resp = (2, 4, 8, 24) if args.tiny else (4, 8, 64, 1024)
    rep.add("shape", {"questions": questions, "k": k, "prompt_tokens": plen, "max_response_tokens": resp,
                      "peak_bf16_tflops": peak})
    rep.add("layout_rule", layout_rule(args.tiny))
    variants = [v for v in VARIANTS if has_packing() or v[0] != "+packed"]
    if args.variants:
        wanted = args.variants.split(",")
        unknown = sorted(set(wanted) - {n for n, _ in VARIANTS})
        if unknown:
            sys.exit(f"train_step: no variant {', '.join(unknown)} (variants: {', '.join(n for n, _ in VARIANTS)})")
        variants = [v for v in variants if v[0] in wanted]
    if not has_packing():
        rep.add("+packed", "not measured: this checkout has no train.pack_sequences")
    extra = ["train.micro_batch_size=4", "train.micro_batch_tokens=64"] if args.tiny else []
    for name, sets in variants:
        cfg = preset_config(args.tiny, [*sets, *extra, f"rollout.max_response_tokens={resp}"])
        s = open_session(cfg)
        try:
            batch = synthetic_batch(s.tokenizer, questions, k, plen, resp)
            model = s.accelerator.unwrap_model(s.model)
            lengths = batch.attention_mask.sum(-1).tolist()
            useful = model_train_flops(model, lengths)
            packed = name == "+packed"
            ran = executed_tokens(batch, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens, packed)
            kw = {**step_kwargs(cfg), "pack": cfg.train.pack_sequences}
            with counting() as syncs:  # the warm-up call (kernels loaded) is the one counted
                s.team.optimise(copy.copy(batch), **kw)
            times = []
            for _ in range(1 if args.tiny else 2):
                sync()
                t0 = time.perf_counter()
                s.team.optimise(copy.copy(batch), **kw)
                sync()
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            tokens = sum(lengths)
            executed = useful * ran / tokens * (8 / 6 if cfg.model.gradient_checkpointing else 1.0)
            entry = {"seconds": times, "tokens": tokens, "executed_tokens": ran,
                     "executed_over_useful_tokens": ran / tokens, "model_tflops": useful / sec / 1e12,
                     "hardware_tflops": executed / sec / 1e12, "host_syncs_per_optimiser_step": syncs.total,
                     "host_syncs_by_kind": dict(syncs.counts), "overrides": sets,
                     "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0}
            if peak:
                entry.update(mfu=useful / sec / 1e12 / peak, hfu=executed / sec / 1e12 / peak)
            else:
                entry.update(mfu=None, hfu=None)
            rep.add(name, entry)
            if name == variants[-1][0]:  # where the remaining MFU gap is: one profiled call of the last variant
                entry["profile"] = profile_call(lambda: s.team.optimise(copy.copy(batch), **kw))
                rep.add(name, entry)
        finally:
            s.close()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    rep.done()


if __name__ == "__main__":
    main()
