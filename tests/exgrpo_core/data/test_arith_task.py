"""The generated arithmetic task and the tiny model's supervised warm start (issue 15, part 1)."""

import json
import re

import pytest

from exgrpo_core.data import arith
from exgrpo_core.data.questions import DataError, load_questions
from exgrpo_core.models import warm_start
from exgrpo_core.models.build import build_tiny_tokenizer
from exgrpo_core.models.load import TINY_SFT, load_policy
from exgrpo_core.reward.grading import extract_final_answer


def test_splits_are_disjoint_fixed_and_cover_every_problem():
    parts = {name: arith.split(name) for name in arith.SPLITS}
    assert len(parts["test"]) == 256 and len(parts["train"]) == 512
    sets = [set(p) for p in parts.values()]
    assert sum(map(len, sets)) == len(set().union(*sets)) == len(arith.all_problems())
    assert arith.split("train") == parts["train"]
    with pytest.raises(ValueError, match="unknown arith split"):
        arith.split("dev")


@pytest.mark.parametrize("op, a, b", [("+", 47, 38), ("+", 10, 10), ("-", 83, 47), ("-", 90, 30), ("-", 55, 55)])
def test_every_worked_answer_is_distinct_correct_step_by_step_and_graded_right(op, a, b):
    sols = arith.solutions(op, a, b)
    assert len(sols) >= 2 and len(set(sols)) == len(sols)
    for s in sols:
        for x, o, y, z in re.findall(r"(-?\d+)([+-])(\d+)=(-?\d+)", s):
            assert (int(x) + int(y) if o == "+" else int(x) - int(y)) == int(z), s
        assert extract_final_answer(s) == str(arith.result(op, a, b))


def test_gen_datasets_load_as_questions():
    qs = load_questions("gen:arith-test", instruction="")
    assert len(qs) == 256 and qs[0].source == "arith-test" and qs[0].messages[0]["content"].endswith("=?")
    assert not {q.uid for q in qs} & {q.uid for q in load_questions("gen:arith-train", instruction="")}
    with pytest.raises(DataError, match="no generated dataset"):
        load_questions("gen:arith-dev")


def test_fine_tune_lowers_the_loss_on_answer_tokens():
    tok = build_tiny_tokenizer()
    from exgrpo_core.models.build import build_tiny_model

    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    losses = warm_start.fine_tune(model, tok, steps=30, lr=3e-3, batch_size=16, seed=0)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    ids, mask, labels = warm_start.batch_tensors([([5, 6], [7, 8]), ([5], [9])], pad_id=0)
    assert labels.tolist() == [[-100, -100, 7, 8], [-100, 9, -100, -100]] and mask.tolist()[1] == [1, 1, 0, 0]


def test_warm_start_is_cached_by_its_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    warm = {"steps": 2, "lr": 1e-3, "batch_size": 4, "seed": 0}
    model, tok = load_policy(TINY_SFT, tiny=tiny, warm_start=warm)
    folder = warm_start.cache_dir(tiny, warm)
    assert folder.is_dir() and model.config.hidden_size == 32 and tok.eos_token == "<eos>"
    monkeypatch.setattr(warm_start, "fine_tune", lambda *a, **k: pytest.fail("retrained a cached warm start"))
    assert warm_start.warm_started(tiny, warm) == folder
    assert warm_start.cache_dir(tiny, {**warm, "steps": 3}) != folder


def test_warm_start_weights_do_not_depend_on_the_thread_count(tmp_path, monkeypatch):
    import torch

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    warm = {"steps": 6, "lr": 3e-3, "batch_size": 48, "seed": 0}
    before = torch.get_num_threads()
    shas = []
    for threads, cache in ((2, "a"), (1, "b")):
        monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path / cache))
        torch.set_num_threads(threads)
        try:
            folder = warm_start.warm_started(tiny, warm)
        finally:
            torch.set_num_threads(before)
        shas.append(warm_start.weights_sha256(folder))
        assert json.loads((folder / "exgrpo_warm_start.json").read_text())["sha256"] == shas[-1]
    assert shas[0] == shas[1] and torch.get_num_threads() == before


def _preset_settings(preset: str = "arith-fast"):
    from exgrpo_core.config.load import load_config

    m = load_config(preset, []).model
    return m.tiny.model_dump(), m.warm_start.model_dump()


@pytest.mark.parametrize("preset", ["arith-fast", "arith3"])
def test_the_presets_warm_start_is_shipped_and_used_without_training(tmp_path, monkeypatch, preset):
    tiny, warm = _preset_settings(preset)
    shipped = warm_start.shipped_weights(tiny, warm)
    assert shipped is not None, f"{preset}'s warm start must ship in exgrpo_core/data/datasets"
    want = json.loads(shipped.with_suffix(".json").read_text())
    assert want["tiny"] == tiny and want["warm"] == warm_start.canonical(warm)
    assert want["version"] == warm_start.FORMAT_VERSION
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(warm_start, "fine_tune", lambda *a, **k: pytest.fail("trained a shipped warm start"))
    folder = warm_start.warm_started(tiny, warm)
    assert warm_start.weights_sha256(folder) == want["sha256"]
    assert json.loads((folder / "exgrpo_warm_start.json").read_text())["source"] == shipped.name
    model, tok = load_policy(TINY_SFT, tiny=tiny, warm_start=warm)
    prompt = tok.apply_chat_template([{"role": "user", "content": arith.question_text("+", 47, 38)}],  # both tasks' form
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "=" in tok.decode(out[0, ids.shape[1]:])  # the worked format, learnt in the warm start


def test_a_shipped_file_that_does_not_match_its_sha_is_refused(tmp_path, monkeypatch):
    tiny, warm = _preset_settings()
    real = warm_start.shipped_weights(tiny, warm)
    ship_dir = tmp_path / "ship"
    ship_dir.mkdir()
    body = bytearray(real.read_bytes())
    body[-1] ^= 1
    (ship_dir / real.name).write_bytes(bytes(body))
    (ship_dir / real.with_suffix(".json").name).write_text(real.with_suffix(".json").read_text())
    monkeypatch.setattr(warm_start, "SHIPPED", ship_dir)
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="does not match the SHA-256"):
        warm_start.warm_started(tiny, warm)
    assert not warm_start.cache_dir(tiny, warm).exists()
