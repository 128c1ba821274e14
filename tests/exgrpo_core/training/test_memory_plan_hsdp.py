"""scripts/memory_plan.py under HSDP: the sharded rows (weights, gradients, AdamW moments) divide by the
shard group (fsdp.mesh_shape, as the run decides it), not by every GPU of the run."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.training import memory_plan as mp

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "memory_plan.py"


def _script():
    spec = importlib.util.spec_from_file_location("memory_plan_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sets,world,per_machine,group", [
    ([], 8, 8, 8),                               # one machine: FSDP over all 8
    ([], 16, 8, 8),                              # two machines, hsdp=auto: a shard group per machine
    (["train.hsdp=off"], 16, 8, 16),             # one 16-GPU FSDP group across both machines
    (["train.shard_size=4"], 16, 8, 4),          # shard groups of 4
    (["train.sharding=replicate", "run.checkpoint_weights=full"], 8, 8, 1),  # replicated: every GPU holds all
])
def test_sharded_rows_divide_by_the_shard_group(sets, world, per_machine, group):
    script = _script()
    cfg = load_config("paper", sets)
    plan = script.plan_for(cfg, mp.QWEN25_MATH_7B, world=world, gpus_per_machine=per_machine)
    p = mp.QWEN25_MATH_7B.params
    assert script.shard_group(cfg, world, per_machine) == group
    for phase in ("sampling", "scoring", "optimiser step"):
        assert plan.phases[phase]["AdamW moments fp32 (sharded)"] == pytest.approx(8 * p / group / mp.GiB)
        assert plan.phases[phase]["weights fp32 (sharded)"] == pytest.approx(4 * p / group / mp.GiB)
    assert plan.rows["gradients fp32 (sharded)"] == pytest.approx(4 * p / group / mp.GiB)


def test_cli_prints_the_group_and_refuses_a_world_that_does_not_split():
    ok = subprocess.run([sys.executable, str(SCRIPT), "--world", "16"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "- shard_group: 8 of 16 GPUs" in ok.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--world", "12"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("memory_plan: train.hsdp=auto: 12 processes")
    assert "Traceback" not in bad.stderr
