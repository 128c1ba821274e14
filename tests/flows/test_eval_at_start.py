"""eval.at_start: the starting policy is evaluated once, at step -1, and never again on resume."""

from types import SimpleNamespace

from exgrpo_core.config.load import load_config
from flows import eval_tasks


def test_start_evaluates_a_fresh_run_once_at_step_minus_one(monkeypatch):
    cfg = load_config("arith-fast", ["eval.max_questions=2"])
    ev = eval_tasks.TrainingEvaluator(cfg)
    calls, stored = [], {}
    monkeypatch.setattr(ev, "run", lambda s, tracker, step: calls.append(step) or stored.setdefault(step, {"a": 1}))
    monkeypatch.setattr(eval_tasks, "stored_summary", lambda store, run_id, step: stored.get(step))
    fresh = SimpleNamespace(step=0, store=None, run_id="r")
    assert ev.start(fresh, None) == {"a": 1} and calls == [-1]
    assert ev.start(fresh, None) == {"a": 1} and calls == [-1]  # a crash before step 0's checkpoint: stored
    assert ev.start(SimpleNamespace(step=5, store=None, run_id="r"), None) is None  # resumed mid-run
    off = eval_tasks.TrainingEvaluator(load_config("arith-fast", ["eval.at_start=false", "eval.max_questions=2"]))
    assert off.start(fresh, None) is None
