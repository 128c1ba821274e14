"""What `evaluate` evaluates: a run's latest checkpoint (with its ids), a checkpoint folder, a plain model
folder or name; misuse is a ConfigError naming the problem. Also the eval config rules."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer, save_policy
from exgrpo_core.run import checkpoint as C
from flows.evaluate import resolve_target


@pytest.fixture
def cfg(tmp_path):
    return load_config("tiny", [f"run.output_dir={tmp_path / 'runs'}"])


def _checkpoint(run_dir, step):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    opt = torch.optim.AdamW(model.parameters())
    return C.save_checkpoint(run_dir, step, model, tok, opt, {"run_id": "r1", "mlflow_run_id": "m1"})


def test_run_name_resolves_to_its_latest_checkpoint_and_ids(cfg, tmp_path):
    run_dir = tmp_path / "runs" / "demo"
    _checkpoint(run_dir, 3)
    latest = _checkpoint(run_dir, 7)
    t = resolve_target(cfg, None, None, "demo")
    assert (t.source, t.label, t.step, t.run_id, t.mlflow_run_id) == (str(latest), "demo", 7, "r1", "m1")
    assert t.run_dir == run_dir.resolve()
    assert resolve_target(cfg, None, str(latest), None).step == 7


def test_plain_model_folder_and_default_model_are_bare_targets(cfg, tmp_path):
    tok = build_tiny_tokenizer()
    save_policy(build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
                tok, tmp_path / "my model")
    t = resolve_target(cfg, None, str(tmp_path / "my model"), None)
    assert t.run_id is None and t.label == "eval-my-model" and t.step == -1  # step 0: the start model
    assert resolve_target(cfg, None, None, None).label == "eval-tiny"


def test_misuse_is_a_config_error_naming_the_problem(cfg, tmp_path):
    with pytest.raises(ConfigError, match="run 'nope' has no checkpoint"):
        resolve_target(cfg, None, None, "nope")
    with pytest.raises(ConfigError, match="one of model, checkpoint or run"):
        resolve_target(cfg, "tiny", None, "demo")
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_target(cfg, None, str(tmp_path / "missing"), None)


def test_eval_during_training_needs_a_suite():
    with pytest.raises(ConfigError, match="eval.every > 0 or eval.final needs something to evaluate on"):
        load_config("tiny", ["eval.final=true", "eval.suites=[]"])
    assert load_config("tiny", ["eval.final=true"]).eval.suites == ["bundled:tiny-arith-test"]  # tiny's own
    assert load_config("tiny", ["eval.every=2", "eval.suites=[gsm8k]"]).eval.suites == ["gsm8k"]
    with pytest.raises(ConfigError, match="pass_k"):
        load_config("tiny", ["eval.pass_k=[0]"])
