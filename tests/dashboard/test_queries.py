"""dashboard/queries.py against a real tiny run: every aggregate equals the same fact computed in raw SQL."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dashboard import queries as Q
from exgrpo_core import metrics as M


def test_list_runs_shows_status_steps_and_last_step_metrics(trained):
    runs = Q.list_runs(trained.db_url).set_index("name")
    assert set(runs.index) == {"exgrpo", "on-policy"}
    assert runs.loc["exgrpo", "status"] == "finished" and runs.loc["exgrpo", "step"] == 8
    assert runs.loc["on-policy", "step"] == 5 and not runs.loc["on-policy", "replay_active"]
    rid = trained.ids["exgrpo"]
    reward = trained.one("select value from step_metrics where run_id=:r and step=7 and key=:k", r=rid,
                         k=M.REWARD_MEAN)
    assert runs.loc["exgrpo", M.REWARD_MEAN] == pytest.approx(reward)


def test_buffer_now_counts_every_question_state(trained):
    rid = trained.ids["exgrpo"]
    now = Q.buffer_now(trained.db_url, rid)
    assert now["questions"].sum() == trained.one("select count(*) from question_states where run_id=:r", r=rid)
    assert now["retired"].sum() == trained.one("select count(*) from question_states where run_id=:r and retired",
                                               r=rid)
    assert now["trajectories"].sum() == trained.one(
        "select count(*) from trajectories where run_id=:r and in_pool", r=rid)


@pytest.mark.parametrize("by", ["correct", "bucket", "source"])
def test_entropy_histograms_count_and_sum_every_trajectory_in_range(trained, by):
    rid = trained.ids["exgrpo"]
    hist = Q.entropy_histogram(trained.db_url, rid, 3, 7, by)  # step numbers 3-7: stored indices 2-6
    fresh = trained.sql("select reward > 0, count(*), sum(entropy) from trajectories where run_id=:r and step "
                        "between 2 and 6 and entropy is not null group by reward > 0", r=rid)
    totals = hist.groupby("group")[["n", "sum"]].sum()
    if by == "correct":
        expect = {("correct" if c else "incorrect"): (n, s) for c, n, s in fresh}
    elif by == "source":
        expect = {("fresh correct" if c else "fresh incorrect"): (n, s) for c, n, s in fresh}
        expect["replayed"] = trained.sql("select count(*), sum(entropy) from replays where run_id=:r and step "
                                         "between 2 and 6 and entropy is not null", r=rid)[0]
        assert expect["replayed"][0] > 0, "the tiny run replayed nothing at steps 2-6"
    else:  # every trajectory belongs to exactly one group of its question at its collection step
        expect = {str(k): (n, s) for k, n, s in trained.sql(
            "select g.k, count(*), sum(t.entropy) from trajectories t join group_results g on g.run_id=t.run_id "
            "and g.question_id=t.question_id and g.step=t.collected_step where t.run_id=:r and t.step between 2 "
            "and 6 and t.entropy is not null group by g.k", r=rid)}
        assert totals["n"].sum() == sum(n for _, n, _ in fresh)
    assert {g: (int(r.n), pytest.approx(r["sum"])) for g, r in totals.iterrows()} == expect
    if by != "source":  # each group's smallest and largest entropy are the database's
        ranges = {str(g): (lo, hi) for g, lo, hi in trained.sql(
            "select g.k, min(t.entropy), max(t.entropy) from trajectories t join group_results g on g.run_id="
            "t.run_id and g.question_id=t.question_id and g.step=t.collected_step where t.run_id=:r and t.step "
            "between 2 and 6 and t.entropy is not null group by g.k" if by == "bucket" else
            "select case when reward > 0 then 'correct' else 'incorrect' end, min(entropy), max(entropy) from "
            "trajectories where run_id=:r and step between 2 and 6 and entropy is not null group by 1", r=rid)}
        got = hist.groupby("group").agg(lo=("lo", "min"), hi=("hi", "max"))
        assert {g: (pytest.approx(r.lo), pytest.approx(r.hi)) for g, r in got.iterrows()} == ranges
    mean = hist["sum"] / hist["n"]  # every bin's mean lies inside the bin
    assert ((mean >= hist["bin"] * Q.BIN_WIDTH - 1e-9) & (mean < (hist["bin"] + 1) * Q.BIN_WIDTH + 1e-9)).all()


def test_replay_entropy_by_step_matches_the_replays(trained):
    rid = trained.ids["exgrpo"]
    per_step = Q.replay_entropy_by_step(trained.db_url, rid).set_index("step")  # step numbers: index + 1
    rows = trained.sql("select step, avg(entropy), count(*) from replays where run_id=:r group by step", r=rid)
    assert len(rows) == len(per_step) > 0
    for step, mean, n in rows:
        step = M.step_number(step)
        assert per_step.loc[step, "replayed"] == n and per_step.loc[step, "mean_entropy"] == pytest.approx(mean)
    assert Q.replay_entropy_by_step(trained.db_url, trained.ids["on-policy"]).empty


def test_question_search_filters_and_pages(trained):
    rid, url = trained.ids["exgrpo"], trained.db_url
    total = trained.one("select count(*) from question_states where run_id=:r", r=rid)
    first, n = Q.search_questions(url, rid, order="uid", limit=10)
    second, n2 = Q.search_questions(url, rid, order="uid", offset=10, limit=10)
    assert n == n2 == total and len(first) == 10
    assert not set(first.uid) & set(second.uid) and list(first.uid) == sorted(first.uid)
    retired, n_ret = Q.search_questions(url, rid, retired=True)
    assert n_ret == trained.one("select count(*) from question_states where run_id=:r and retired", r=rid)
    assert retired["retired"].all()
    k = int(first.latest_k.dropna().iloc[0])
    _, n_k = Q.search_questions(url, rid, bucket=k)
    assert n_k == trained.one("select count(*) from question_states where run_id=:r and latest_k=:k", r=rid, k=k)
    replayed, n_rep = Q.search_questions(url, rid, min_replayed=1)
    assert n_rep == trained.one("select count(*) from question_states where run_id=:r and times_replayed >= 1",
                                r=rid) and (replayed.times_replayed >= 1).all()
    text = first.text.iloc[0]
    found, _ = Q.search_questions(url, rid, text=text)
    assert text in set(found.text)
    rolled, n_rolled = Q.search_questions(url, rid, rolled_out=True, limit=1000)
    assert n_rolled == trained.one("select count(*) from question_states where run_id=:r and n_groups > 0", r=rid)
    assert (rolled.n_groups > 0).all() and len(rolled) == n_rolled


def test_question_history_and_trajectory_pages(trained):
    rid, url = trained.ids["exgrpo"], trained.db_url
    qid, n_groups = trained.sql("select question_id, n_groups from question_states where run_id=:r "
                                "order by n_groups desc, uid limit 1", r=rid)[0]
    groups = Q.question_groups(url, rid, qid)
    assert len(groups) == n_groups and list(groups.step) == sorted(groups.step)
    stored = trained.one("select count(*) from trajectories where run_id=:r and question_id=:q", r=rid, q=qid)
    page, n = Q.question_trajectories(url, rid, qid, limit=3)
    rest, _ = Q.question_trajectories(url, rid, qid, offset=3, limit=1000)
    assert n == stored and len(page) == min(3, stored) and len(page) + len(rest) == stored
    assert set(page.id).isdisjoint(rest.id)
    steps = list(pd.concat([page, rest]).collected_step)
    assert steps == sorted(steps, reverse=True)  # newest group first: a page holds whole groups
    for correct in (True, False):
        for replayed in (True, False):
            rows, n = Q.question_trajectories(url, rid, qid, correct=correct, replayed=replayed, limit=1000)
            assert n == len(rows) == trained.one(
                "select count(*) from trajectories where run_id=:r and question_id=:q and (reward > 0) = :c and "
                "(times_replayed > 0) = :p", r=rid, q=qid, c=correct, p=replayed)
            assert ((rows.reward > 0) == correct).all() and ((rows.times_replayed > 0) == replayed).all()


def test_replays_per_bucket_equal_the_stores_count(trained):
    from exgrpo_core.store.experience_store import ExperienceStore

    store = ExperienceStore(trained.db_url)
    try:
        for rid in trained.ids.values():
            got = Q.replay_buckets(trained.db_url, rid)
            assert dict(zip(got.k, got.replayed)) == store.replay_buckets(rid)
        assert store.replay_buckets(trained.ids["exgrpo"]), "the tiny exgrpo run replayed nothing"
    finally:
        store.close()


def test_target_weights_are_the_runs_normalised_bucket_weights(trained):
    from exgrpo_core.algorithm.selection import bucket_weights

    weights, weighting = Q.target_weights(trained.db_url, trained.ids["exgrpo"])
    expect = bucket_weights(8, "gaussian", 1.0, "count")  # the tiny preset's selection defaults
    assert weighting == "gaussian" and set(weights) == set(range(1, 8))
    assert weights == pytest.approx({k: w / sum(expect.values()) for k, w in expect.items()})
    assert Q.target_weights(trained.db_url, "no-such-run") == ({}, "unknown run")


def test_metric_keys_are_the_logged_ones(trained):
    rid = trained.ids["on-policy"]
    assert Q.metric_keys(trained.db_url, (rid,)) == sorted(
        k for (k,) in trained.sql("select distinct key from step_metrics where run_id=:r", r=rid))


def test_eval_results_come_from_the_runs_evaluations(trained):
    rows = Q.eval_results(trained.db_url, (trained.ids["exgrpo"], trained.ids["on-policy"]))
    assert set(rows.run_id) == {trained.ids["exgrpo"]}, "only the exgrpo run evaluated"
    assert {4, 8} <= set(rows.step)  # evaluated every 4 steps: stored at indices 3 and 7
    p1 = rows[(rows.metric == "pass@1") & (rows.benchmark == "tiny-arith")]
    assert all(0 <= v <= 1 for v in p1.value) and not any(math.isnan(v) for v in p1.value)


def test_metric_series_only_returns_asked_keys_and_runs(trained):
    rid = trained.ids["on-policy"]
    m = Q.metric_series(trained.db_url, (rid,), (M.REWARD_MEAN, M.bucket_key(0)))
    assert set(m.key) == {M.REWARD_MEAN, M.bucket_key(0)} and set(m.run_id) == {rid}
    assert sorted(m[m.key == M.REWARD_MEAN].step) == list(range(1, 6))  # steps 1-5, stored 0-4
