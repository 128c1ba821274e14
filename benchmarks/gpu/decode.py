"""Sections (a) and (b) of benchmarks/gpu_check.sh: every sampling path (each choice of `rollout.decoder`)
on the real-shape preset, through a session as a run builds it.

(a) decode.json: ms per decode step and tokens/s at 256 rows (32 prompts x 8), a torch.profiler
    summary of a short run (kernels and GPU-busy ms per step on CUDA, operator calls per step on CPU,
    cudaStreamSynchronize / device-to-host copies) and host syncs per step (`host_syncs.HostSyncCounter`).
(b) agreement.json: greedy agreement (temperature 1e-4: each path's tokens against the eager float32
    model's argmax under teacher forcing) and the log-prob gap (temperature 1: |path's log-prob of its
    sampled token - the eager model's|, mean and max).

    python benchmarks/gpu/decode.py [--tiny] [--out DIR]
"""

from __future__ import annotations

import statistics
import sys
import time
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.common import Report, cuda_kernels, parse, preset_config, sync  # noqa: E402


def decoders() -> list[str]:
    """The choices of `rollout.decoder` in the config schema (the engine's paths)."""
    from exgrpo_core.config.schema import RolloutConfig

    field = RolloutConfig.model_fields.get("decoder")
    choices = typing.get_args(field.annotation) if field is not None else ()
    return [c for c in choices if c != "auto"] or ["own"]  # auto is one of the others


def prompts(tok, n: int, length: int) -> list[list[int]]:
    """n distinct prompts of `length` ids from the tokenizer's own vocabulary, a shared 4-token start."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(tok), (n, length), generator=g)
    ids[:, :4] = ids[0, :4]
    return ids.tolist()


def profile(generate, steps: int) -> dict:
    """Kernels, GPU-busy ms, operator calls and host waits per decode step of one short generate."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from exgrpo_core.observe.host_syncs import counting

    with counting() as syncs:
        generate(steps)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=acts) as prof:
        generate(steps)
        sync()
    events = prof.events()
    kernels, busy_ms = cuda_kernels(prof)
    ops = [e for e in events if e.name.startswith("aten::")]
    stream_syncs = sum(1 for e in events if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    d2h = sum(1 for e in events if "Memcpy DtoH" in e.name or e.name == "cudaMemcpyAsync")
    top = sorted(prof.key_averages(), key=lambda a: -(getattr(a, "self_device_time_total", 0) or a.self_cpu_time_total))
    return {"steps": steps, "kernels_per_step": len(kernels) / steps, "gpu_busy_ms_per_step": busy_ms / steps,
            "aten_ops_per_step": len(ops) / steps, "stream_syncs_per_step": stream_syncs / steps,
            "memcpy_per_step": d2h / steps, "host_syncs_per_step": syncs.total / steps,
            "host_syncs_by_kind": dict(syncs.counts),
            "top_ops": [{"name": a.key, "calls": a.count, "self_cpu_ms": a.self_cpu_time_total / 1e3,
                         "self_device_ms": getattr(a, "self_device_time_total", 0) / 1e3} for a in top[:12]]}


def agreement(s, rows: list[list[int]], new_tokens: int) -> dict:
    """Greedy agreement and log-prob gap of the session's sampling path against its eager float32 model."""
    import torch

    from exgrpo_core.training import policy

    model = s.accelerator.unwrap_model(s.model)
    device = next(model.parameters()).device
    out = {}
    for temperature, key in ((1e-4, "greedy"), (1.0, "sampled")):
        torch.manual_seed(1)
        gens = [g for group in s.team.generate(rows, 1, temperature=temperature, max_new_tokens=new_tokens)
                for g in group]
        width = max(len(p) + len(g.response_ids) for p, g in zip(rows, gens))
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        resp = torch.zeros_like(ids, dtype=torch.bool)
        path_lp = torch.zeros(len(rows), width)
        for i, (p, g) in enumerate(zip(rows, gens)):
            seq = p + g.response_ids
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            resp[i, len(p):len(seq)] = True
            path_lp[i, len(p):len(seq)] = torch.tensor(g.logprobs, dtype=torch.float32)
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            if key == "greedy":
                agree = total = 0
                for r in range(0, len(rows), 4):
                    logits = model(input_ids=ids[r:r + 4].to(device), attention_mask=mask[r:r + 4].to(device)).logits
                    best = logits.float().argmax(-1)[:, :-1].cpu()  # column t predicts token t + 1
                    hit = (best == ids[r:r + 4, 1:]) & resp[r:r + 4, 1:]
                    agree += int(hit.sum())
                    total += int(resp[r:r + 4, 1:].sum())
                out["greedy_agreement"] = agree / max(total, 1)
                out["greedy_tokens"] = total
            else:
                lp, _ = policy.token_logprobs_and_entropy(model, ids, mask, micro_batch_size=4, with_entropy=False,
                                                          score_mask=resp, share_prompts=False)
                gap = (lp.cpu() - path_lp).abs()[resp]
                out.update(logprob_gap_mean=float(gap.mean()), logprob_gap_max=float(gap.max()),
                           logprob_gap_tokens=int(resp.sum()), eager_dtype=str(next(model.parameters()).dtype))
    return out


def main() -> None:
    args = parse(__doc__)
    n_prompts, per, plen, steps = (4, 4, 16, 8) if args.tiny else (32, 8, 64, 128)
    dec, agr = Report("decode", args), Report("agreement", args)
    dec.add("shape", {"rows": n_prompts * per, "prompt_tokens": plen, "decode_steps": steps})
    failed = []
    for choice in decoders():
        try:
            measure(args, choice, dec, agr, n_prompts, per, plen, steps)
        except Exception as e:  # one path's failure is recorded; the others are still measured
            failed.append(choice)
            dec.add(choice, {"error": f"{type(e).__name__}: {e}"[:2000]})
            agr.add(choice, {"error": f"{type(e).__name__}: {e}"[:2000]})
    dec.done("failed: " + ", ".join(failed) if failed else "ok")
    agr.done("failed: " + ", ".join(failed) if failed else "ok")
    sys.exit(1 if failed else 0)


def measure(args, choice: str, dec: Report, agr: Report, n_prompts: int, per: int, plen: int, steps: int) -> None:
    """Open a session sampling with `choice` and add its speed, profile and agreement to the reports."""
    from exgrpo_core.run.session import open_session

    cfg = preset_config(args.tiny, [f"rollout.decoder={choice}", f"rollout.generation_batch_size={n_prompts * per}",
                                    "rollout.decode_streams=1"])
    s = open_session(cfg)
    try:
        rows = prompts(s.tokenizer, n_prompts, plen)

        def generate(k: int, n: int = per):
            return s.team.generate(rows, n, temperature=1.0, max_new_tokens=k)

        generate(steps)  # start-up at the timed length: kernels loaded, graphs captured for that cache shape
        times = []
        for _ in range(2 if args.tiny else 1):  # one 128-step run on a GPU: the 7-minute budget
            sync()
            t0 = time.perf_counter()
            out = generate(steps)
            sync()
            times.append(time.perf_counter() - t0)
        made = [len(g.response_ids) for group in out for g in group]
        wall = statistics.median(times)
        entry = {"ms_per_step": 1e3 * wall / max(max(made), 1), "tokens_per_s": sum(made) / wall,
                 "rows": len(made), "longest": max(made), "tokens": sum(made), "seconds": times}
        dec.add(choice, entry)
        entry["profile"] = profile(lambda k: generate(k), 4 if args.tiny else 16)
        dec.add(choice, entry)
        agr.add(choice, agreement(s, [r for r in rows for _ in range(2)][:max(4, n_prompts)],
                                  8 if args.tiny else 64))
    finally:
        s.close()


if __name__ == "__main__":
    main()
