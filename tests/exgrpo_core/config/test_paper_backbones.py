"""The presets of the paper's Table 5 backbones (configs/paper-*.yaml next to configs/paper.yaml): each resolves
through `exgrpo config`, passes the start's check_context against a config.json of its model's published shape
(written here: the weights and configs cannot be downloaded), and fits 8 x 80 GB by scripts/memory_plan.py with
the numbers its header states."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from transformers import LlamaConfig, Qwen2Config

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.run.session import check_context
from exgrpo_core.training import memory_plan as mp
from flows import cli

ROOT = Path(__file__).resolve().parents[3]
LLAMA31_8B = dict(cls=LlamaConfig, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                  tie_word_embeddings=False, rope_theta=500000.0)
# the published config.json values of each backbone (Hugging Face model cards)
SHAPES = {
    "paper-qwen2.5-math-1.5b": ("Qwen/Qwen2.5-Math-1.5B", dict(
        cls=Qwen2Config, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True,
        rope_theta=10000.0)),
    "paper-qwen2.5-7b-instruct": ("Qwen/Qwen2.5-7B-Instruct", dict(
        cls=Qwen2Config, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False,
        rope_theta=1000000.0)),
    "paper-llama3.1-8b": ("meta-llama/Llama-3.1-8B", LLAMA31_8B),
    "paper-llama3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", LLAMA31_8B),
}
HEADLINE = re.compile(r"sampling / scoring / optimiser step ([\d.]+) / ([\d.]+) / ([\d.]+) GiB per GPU")


def _config_json(tmp_path: Path, preset: str) -> Path:
    shape = dict(SHAPES[preset][1])
    folder = tmp_path / preset
    shape.pop("cls")(**shape).save_pretrained(folder)
    return folder


def _script():
    spec = importlib.util.spec_from_file_location("memory_plan_script", ROOT / "scripts" / "memory_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_paper_preset_is_covered():
    assert {p.stem for p in (ROOT / "configs").glob("paper-*.yaml")} == set(SHAPES)


@pytest.mark.parametrize("preset", sorted(SHAPES))
def test_preset_resolves_fits_its_context_and_8_x_80_gb(tmp_path, preset, capsys):
    assert cli.main(["config", "--config", preset]) == 0  # `exgrpo config --config X`
    resolved = yaml.safe_load(capsys.readouterr().out)
    name, _ = SHAPES[preset]
    cfg = load_config(preset)
    assert resolved == cfg.model_dump(mode="json") and cfg.model.name_or_path == name and cfg.run.steps == 500
    base = preset == "paper-llama3.1-8b"
    assert cfg.buffer.start_threshold == (0 if base else 0.35)  # the paper: replay from the start for Llama base
    assert cfg.data.prompt_template == ("User: {question} Answer: Let's think step by step." if base else "chat")

    folder = _config_json(tmp_path, preset)
    local = load_config(preset, [f"model.name_or_path={folder}"])
    check_context(local)  # the start's check, against the model's real max_position_embeddings
    limit = SHAPES[preset][1]["max_position_embeddings"]
    assert cfg.rollout.max_prompt_tokens + max(cfg.rollout.max_response_tokens, cfg.eval.max_response_tokens) <= limit

    config = json.loads((folder / "config.json").read_text())
    shape = mp.ModelShape.from_hf_config(SimpleNamespace(**config))
    plan = _script().plan_for(cfg, shape, world=8, gpus_per_machine=8, varlen=True)  # GPU torch: packed
    assert plan.total < 0.8 * 80  # the margin test_memory_plan.py keeps for the paper preset
    stated = HEADLINE.search(" ".join(l.lstrip("# ") for l in (ROOT / "configs" / f"{preset}.yaml").read_text()
                                      .splitlines() if l.startswith("#")))
    got = tuple(round(sum(rows.values()), 1) for rows in plan.phases.values())
    assert stated and tuple(float(x) for x in stated.groups()) == got  # the header's headline is the plan's


def test_the_1_5b_context_is_refused_past_its_4096_positions(tmp_path):
    folder = _config_json(tmp_path, "paper-qwen2.5-math-1.5b")
    with pytest.raises(ConfigError, match="max_position_embeddings \\(4096\\)"):
        check_context(load_config("paper-qwen2.5-math-1.5b", [f"model.name_or_path={folder}",
                                                             "rollout.max_response_tokens=8192"]))
