"""The shipped accelerate configs parse with accelerate's own loader and ask for what we support."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig

from exgrpo_core.run.session import SUPPORTED_DISTRIBUTED

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs" / "accelerate").glob("*.yaml"))


def test_configs_exist():
    assert {p.stem for p in CONFIGS} >= {"ddp-8gpu", "ddp-2x8gpu"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_a_supported_launch(path):
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.distributed_type.value in SUPPORTED_DISTRIBUTED
    assert cfg.num_processes % cfg.num_machines == 0 and cfg.num_processes >= 2
    assert "flows.cli train" in path.read_text(), "each config says how to launch with it"
