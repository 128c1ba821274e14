"""benchmarks/gpu_check.sh runs end to end on a CPU with tiny shapes and writes every section's JSON, each
naming the device, torch and the commit, with its measurements filled in (issue 32 item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["decode", "agreement", "train_step", "fsdp_check", "cuda_tests"]


def test_gpu_check_runs_tiny_on_cpu(tmp_path):
    # no --tiny and no OUT: without CUDA it rehearses by itself, into $TMPDIR, never over the committed results
    committed = {p.name: p.read_bytes() for p in (ROOT / "benchmarks" / "results" / "gpu").glob("*")}
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(TMPDIR=str(tmp_path), PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in (ROOT / "benchmarks" / "results" / "gpu").glob("*")} == committed
    tmp_path = tmp_path / "gpu_check_tiny"
    summary = json.loads((tmp_path / "summary.json").read_text())
    decode = json.loads((tmp_path / "decode.json").read_text())["results"]
    errors = {k: v["error"] for k, v in decode.items() if isinstance(v, dict) and "error" in v}
    assert not errors, f"sampling paths failed on the shrunk real-shape preset: {errors}"
    assert all(summary[name]["returncode"] == 0 for name in ("decode", "train_step", "fsdp_check", "cuda_tests")), summary
    got = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in SECTIONS}
    for name, d in got.items():
        assert d["status"] == "ok" and d["device"] == "cpu" and d["tiny"], (name, d.get("status"))
        assert d["torch"] and d["commit"] and d["commit"] != "unknown"
    from exgrpo_core.config.schema import RolloutConfig
    import typing

    decoders = [c for c in typing.get_args(RolloutConfig.model_fields["decoder"].annotation) if c != "auto"]
    for choice in decoders:
        dec = got["decode"]["results"][choice]
        assert dec["ms_per_step"] > 0 and dec["tokens_per_s"] > 0 and dec["rows"] == 16
        assert dec["profile"]["aten_ops_per_step"] > 0 and "host_syncs_per_step" in dec["profile"]
        agr = got["agreement"]["results"][choice]
        assert agr["greedy_tokens"] > 0 and 0 <= agr["greedy_agreement"] <= 1
        assert agr["logprob_gap_tokens"] > 0 and agr["logprob_gap_max"] >= agr["logprob_gap_mean"] >= 0
    train = got["train_step"]["results"]
    assert train["+packed"]["executed_over_useful_tokens"] == 1.0 < train["before"]["executed_over_useful_tokens"]
    # (padded micro-batches read their rows on the host too: as few syncs as packed ones, test_padded_syncs.py)
    assert train["+packed"]["host_syncs_per_optimiser_step"] <= train["+replicate"]["host_syncs_per_optimiser_step"]
    for variant in ("before", "+replicate", "+no-checkpointing", "+packed"):
        assert train[variant]["model_tflops"] > 0 and train[variant]["hardware_tflops"] >= train[variant]["model_tflops"]
        assert train[variant]["host_syncs_per_optimiser_step"] > 0
    prof = train["+packed"]["profile"]  # (where the remaining MFU gap is, on a GPU)
    assert prof["wall_ms"] > 0 and prof["top"] and all(op["ms"] >= 0 and op["calls"] > 0 for op in prof["top"])
    acc = got["fsdp_check"]["results"]["accumulation"]
    assert acc["micro_batches"] >= 4 and acc["no_unsharded_accumulator"] and acc["grad_types"] == ["DTensor"]
    assert got["fsdp_check"]["results"]["memory"]["plan_after_step_gib"] > 0
    tests = got["cuda_tests"]["results"]
    assert tests["counts"]["skipped"] > 0 and tests["counts"]["failed"] == 0 and len(tests["files"]) >= 2
