"""Counterfactual replay on a finished tiny run: the rebuilt pool matches the run's logged pool at every
step, the run's own replays are read back, and another policy's draws come only from the rebuilt pool."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.store import what_if as W
from exgrpo_core.run.session import open_session


def half_right(texts, answers):
    return [(1.0, "correct") if i % 3 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whatif")
    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'x.db'}", "run.name=wi",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "data.max_questions=24"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    for _ in range(5):
        loop.run_iteration(s)
    run_id, store = s.run_id, s.store
    s.store = None  # keep the store open for the tests
    s._closers.remove(store.close)
    s.close()
    yield cfg, store, run_id
    store.close()


def test_the_run_s_own_policy_rebuilds_its_pool_and_reads_its_replays(finished):
    cfg, store, run_id = finished
    out = W.what_if(store, run_id, cfg, seed=1)  # raises when a rebuilt pool size differs from the logged one
    data = W.read_run(store, run_id)
    assert out["actual"]["replays"] == sum(1 for *_, is_replay in data["history"] if is_replay) > 0
    assert out["steps"] == [2, 5] and out["what_if"]["replays"] > 0
    pool = W.pools(data, keep_bucket_on_zero=True)
    for d in out["per_step"]:
        for q, k in zip(d["questions"], d["buckets"]):
            assert q in pool[d["step"]][k] and 1 <= k <= 3  # drawn from the pool, never bucket 0 or K
        assert all(a >= 1 for a in d["ages"])


def test_another_policy_moves_the_shares_the_way_its_weights_say(finished):
    cfg, store, run_id = finished
    low = load_config("tiny", ["rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
                               "selection.mu=0.25", "selection.sigma=0.5"])
    high = load_config("tiny", ["rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
                                "selection.mu=0.75", "selection.sigma=0.5"])
    a, b = (W.what_if(store, run_id, c, seed=3)["what_if"] for c in (low, high))
    mean = lambda s: sum(k * v for k, v in s["share"].items())  # noqa: E731
    assert mean(a) < mean(b) and a["target"][1] > a["target"][3] and b["target"][3] > b["target"][1]


def test_a_run_with_a_retired_set_review_is_refused(finished):
    cfg, store, run_id = finished
    row = store.get_run(run_id)
    fake = type("S", (), {"get_run": lambda self, rid: {**row, "config": {"buffer": {"review_retired_every": 25}}}})()
    with pytest.raises(W.WhatIfError, match="reviewed its retired set"):
        W.what_if(fake, run_id, cfg)
