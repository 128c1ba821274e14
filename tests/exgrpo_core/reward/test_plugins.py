"""Reward functions of the user's (reward.fn): found by path or installed name, bad ones refused in one
line, every per-item failure scored 0 with a named reason, a hang killed by the per-item timeout."""

from __future__ import annotations

import textwrap

import pytest

from exgrpo_core.reward import examples, plugins
from exgrpo_core.types import Question

USER_MODULE = '''
import math, time

def quarter(row, response):
    return 0.25

def graded(row, response):
    return {"reward": 1.0 if response == row["answer"] else 0.0, "reason": "same" if response == row["answer"] else "differs"}

def picky(row, response):
    if response == "raise":
        raise ValueError("cannot read " + response)
    if response == "nan":
        return math.nan
    if response == "big":
        return 1.5
    if response == "text":
        return "yes"
    if response == "hang":
        time.sleep(60)
    if response == "long":
        return 0.5, "a reason far longer than the sixteen characters the database keeps"
    return 0.5, "fine"

def one_arg(row):
    return 1.0

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "broken_rewards.py").write_text("import no_such_package_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_installed_rewards_resolve_by_name_and_score():
    assert plugins.resolve("exact_match") is examples.exact_match
    assert plugins.resolve("arith_format") is examples.arith_format
    assert plugins.version("exact_match").startswith("exgrpo-")


@pytest.mark.parametrize("spec, words", [
    ("no_such_reward", ["neither package.module:callable nor an installed reward", "exact_match"]),
    ("broken_rewards:score", ["importing 'broken_rewards' failed", "ModuleNotFoundError"]),
    ("my_rewards:absent", ["has no attribute 'absent'"]),
    ("my_rewards:one_arg", ["must take (row, response)"]),
    ("my_rewards:NOT_A_FUNCTION", ["is a int, not a function"]),
])
def test_an_unusable_function_is_one_line_naming_it(user_module, spec, words):
    with pytest.raises(plugins.RewardPluginError) as e:
        plugins.resolve(spec)
    message = str(e.value)
    assert "\n" not in message and spec in message
    for w in words:
        assert w in message


def test_the_pool_refuses_a_function_that_does_not_import_before_any_item(user_module):
    with pytest.raises(plugins.RewardPluginError, match="importing 'broken_rewards' failed"):
        plugins.RewardFunctionPool("broken_rewards:score", timeout_s=5)


@pytest.mark.parametrize("value, binary, expected", [
    (0.25, False, (0.25, "scored", None)), (True, False, (1.0, "scored", None)),
    ((1, "same"), True, (1.0, "same", None)), ({"reward": 0.0, "reason": "no"}, True, (0.0, "no", None)),
    (0.5, True, (0.0, "invalid", "returned 0.5 in a binary run (reward.kind=continuous takes any value in [0, 1])")),
    (float("inf"), False, (0.0, "invalid", "returned inf, outside [0, 1]")),
    (-0.1, False, (0.0, "invalid", "returned -0.1, outside [0, 1]")),
    (None, False, (0.0, "invalid", "returned NoneType, not a number")),
])
def test_what_a_function_returns_is_scored_or_named_invalid(value, binary, expected):
    assert plugins.score(value, binary) == expected


def test_each_failing_item_scores_zero_with_its_reason_and_the_rest_are_scored(user_module):
    responses = ["ok", "raise", "nan", "big", "text", "hang", "long", "ok"]
    with plugins.RewardFunctionPool("my_rewards:picky", timeout_s=1.5, workers=1) as pool:
        got = pool.score_rows(responses, [{"answer": "x"}] * len(responses))
        again = pool.score_rows(["ok"], [{"answer": "x"}])  # the hung worker was replaced
    reasons = [r for _, r, _ in got]
    assert reasons == ["fine", "error", "invalid", "invalid", "invalid", "timeout", "a reason far lon", "fine"]
    assert [x for x, _, _ in got] == [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5]
    assert got[1][2] == "ValueError: cannot read raise"
    assert got[2][2] == "returned nan, outside [0, 1]" and got[5][2] == "no score within 1.5 s"
    assert got[6][2].startswith("a reason far longer")  # the whole reason kept as the audit text
    assert pool.timeouts == 1 and again == [(0.5, "fine", None)]


def test_the_function_gets_the_question_row_with_its_own_fields(user_module):
    q = Question("q1", ({"role": "user", "content": "Capital of France?"},), "Paris", "quiz",
                 info='{"pattern": "paris|lutetia", "level": 2}')
    row = plugins.row_of(q)
    assert row["pattern"] == "paris|lutetia" and row["level"] == 2
    assert (row["uid"], row["question"], row["answer"], row["source"]) == ("q1", "Capital of France?", "Paris", "quiz")
    with plugins.RewardFunctionPool("my_rewards:graded", timeout_s=5) as pool:
        assert pool.score_rows(["Paris", "Rome"], [row, row]) == [(1.0, "same", None), (0.0, "differs", None)]
    assert examples.exact_match(row, "so \\boxed{Lutetia}") == (1.0, "match")
    assert examples.exact_match({"answer": "Paris"}, "It is\n**paris**.") == (1.0, "match")
    assert examples.exact_match({"answer": "Paris"}, "Rome") == (0.0, "no_match")


def test_arith_format_is_continuous_in_zero_one():
    right = examples.arith_format({"answer": "12"}, "3*4 = \\boxed{12}")
    assert right == {"reward": 0.997, "reason": "right+boxed"}
    plain = examples.arith_format({"answer": "12"}, "3*4 = 12")
    wrong = examples.arith_format({"answer": "12"}, "I think " * 200)
    assert 0.7 < plain["reward"] < right["reward"] and wrong == {"reward": 0.0, "reason": "wrong"}
