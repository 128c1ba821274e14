"""The three-digit arithmetic task: disjoint fixed splits, correct worked answers, loadable as gen:arith3-*."""

from __future__ import annotations

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.data import arith3
from exgrpo_core.data.questions import DataError, load_questions
from exgrpo_core.models import warm_start as ws
from exgrpo_core.reward.grading import extract_final_answer


def test_splits_are_disjoint_fixed_and_of_their_sizes():
    parts = {n: arith3.split(n) for n in arith3.SPLITS}
    assert {n: len(p) for n, p in parts.items()} == arith3.SPLIT_SIZES
    assert sum(len(set(p)) for p in parts.values()) == len(set().union(*map(set, parts.values())))
    assert all(100 <= a <= 999 and 100 <= b <= 999 and (op == "+" or a >= b) for p in parts.values() for op, a, b in p)
    assert arith3.split("test")[:3] == arith3.split("test")[:3]


def test_every_worked_step_is_true_and_ends_with_the_result():
    for op, a, b in arith3.split("train"):
        forms = arith3.solutions(op, a, b)
        assert len(forms) >= 2
        for s in forms:
            for step in s.split():
                left, right = step.split("=")
                x, sign, y = left.partition("+") if "+" in left else left.partition("-")
                assert (int(x) + int(y) if sign == "+" else int(x) - int(y)) == int(right), s
            assert int(extract_final_answer(s)) == arith3.result(op, a, b)
    assert arith3.solutions("+", 347, 285)[0] == "347+200=547 547+80=627 627+5=632"


def test_the_generated_datasets_load_and_the_preset_warm_starts_on_them():
    qs = load_questions("gen:arith3-test", instruction="")
    assert len(qs) == 256 and qs[0].source == "arith3-test" and qs[0].text.endswith("=?")
    with pytest.raises(DataError, match="arith3-train"):
        load_questions("gen:arith3-dev")
    cfg = load_config("arith3")
    warm = cfg.model.warm_start.model_dump()
    assert warm["task"] == "arith3" and cfg.data.train_path == "gen:arith3-train"
    arith_fast = load_config("arith-fast").model.warm_start.model_dump()
    assert ws.settings_key({}, arith_fast) == ws.settings_key({}, {k: v for k, v in arith_fast.items() if k != "task"})
    assert ws.settings_key({}, {**arith_fast, "task": "arith3"}) != ws.settings_key({}, arith_fast)
