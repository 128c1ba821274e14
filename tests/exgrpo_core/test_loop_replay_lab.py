"""The replay lab's arms in real tiny iterations: the age cap, the age-decayed draw (and what-if honouring
both), dynamic sampling, and the sequence-level importance weights."""

from __future__ import annotations

import math

import pytest
import torch
from sqlalchemy import text

from exgrpo_core import loop
from exgrpo_core.algorithm import age
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.store import what_if as W


def some_right(texts, answers):
    return [(1.0, "correct") if i % 3 else (0.0, "wrong") for i in range(len(texts))]


def tiny(tmp_path, *knobs, name="lab"):
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / (name + '.db')}",
                                f"run.name={name}", "rollout.max_response_tokens=3", "rollout.group_size=4",
                                "train.batch_size=8", "train.mini_batch_size=4", "buffer.start_threshold=0",
                                "run.resume=never", "data.max_questions=24", *knobs])


def run(cfg, steps, verify=some_right, keep_store=False):
    torch.manual_seed(0)
    s = open_session(cfg, verify=verify)
    try:
        stats = [loop.run_iteration(s) for _ in range(steps)]
        with s.store.engine.connect() as conn:
            ages = conn.execute(text("select r.step - t.step from replays r join trajectories t "
                                     "on t.id = r.trajectory_id")).scalars().all()
        store, run_id = s.store, s.run_id
        if keep_store:
            s.store = None
            s._closers.remove(store.close)
    finally:
        s.close()
    return stats, ages, (store, run_id)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    stats, ages, (store, run_id) = run(tiny(tmp_path_factory.mktemp("plain")), 6, keep_store=True)
    yield stats, ages, store, run_id
    store.close()


def test_no_trajectory_older_than_max_age_is_replayed_and_what_if_honours_it(tmp_path, plain_run):
    _, plain_ages, store, run_id = plain_run
    assert max(plain_ages) > 1  # without the cap older trajectories are replayed
    cfg = tiny(tmp_path, "buffer.max_age=1")
    stats, ages, _ = run(cfg, 6)
    assert ages and max(ages) <= 1
    assert all(st["select/age_max"] <= 1 for st in stats)
    capped = W.what_if(store, run_id, cfg, seed=1)["per_step"]
    assert any(capped) and all(a <= 1 for d in capped for a in d["ages"])
    free = W.what_if(store, run_id, tiny(tmp_path), seed=1)["per_step"]
    assert max(a for d in free for a in d["ages"]) > 1


def test_the_age_decayed_draw_weighs_each_pooled_question_by_its_newest_candidate(tmp_path, monkeypatch):
    seen = []
    draw = age.sample_aged_questions
    monkeypatch.setattr(age, "sample_aged_questions",
                        lambda b, n, w, rng, pq, ma, hl: (seen.append((b, hl)), draw(b, n, w, rng, pq, ma, hl))[1])
    cfg = tiny(tmp_path, "selection.age_half_life=2")
    torch.manual_seed(0)
    s = open_session(cfg, verify=some_right)
    try:
        for _ in range(3):
            newest = {}
            with s.store.engine.connect() as conn:
                for uid, step in conn.execute(text(
                        "select q.uid, max(t.step) from trajectories t join question_states q on q.run_id = t.run_id "
                        "and q.question_id = t.question_id where t.in_pool and not q.retired group by q.uid")):
                    newest[uid] = s.step - step
            before = len(seen)
            loop.run_iteration(s)
            if len(seen) > before:
                buckets, hl = seen[-1]
                assert hl == 2.0
                assert {u: a for members in buckets.values() for u, a in members} == {
                    u: a for u, a in newest.items() if u in {m for ms in buckets.values() for m, _ in ms}}
                assert all(a >= 1 for ms in buckets.values() for _, a in ms)
    finally:
        s.close()
    assert seen, "the age-decayed draw never ran"


def by_question(texts, answers):
    """A third of the questions always right, a third always wrong, a third half right (by their answer)."""
    kind = [sum(map(ord, a)) % 3 for a in answers]
    return [(1.0, "correct") if k == 1 or (k == 2 and i % 2) else (0.0, "wrong") for i, k in enumerate(kind)]


@pytest.mark.parametrize("ratio", [0, 0.5])
def test_dynamic_sampling_drops_all_equal_fresh_groups_and_refills_the_batch(tmp_path, monkeypatch, ratio):
    trained = []
    rows_of = loop.shuffled_rows
    monkeypatch.setattr(loop, "shuffled_rows", lambda groups, replayed, *a: (trained.append(list(groups)),
                                                                             rows_of(groups, replayed, *a))[1])
    cfg = tiny(tmp_path, f"buffer.replay_ratio={ratio}", "rollout.dynamic_sampling=true",
               "rollout.dynamic_sampling_rounds=2", "data.max_questions=48")
    torch.manual_seed(0)
    s = open_session(cfg, verify=by_question)
    try:
        stats = [loop.run_iteration(s) for _ in range(3)]
        with s.store.engine.connect() as conn:
            history = conn.execute(text("select step, is_replay, k from group_results order by id")).all()
    finally:
        s.close()
    for step, (st, groups) in enumerate(zip(stats, trained)):
        recorded = [(r, k) for t, r, k in history if t == step]
        equal = sum(1 for r, k in recorded if not r and k in (0, 4))
        assert st["rollout/ds_dropped_groups"] == equal > 0  # every all-equal fresh group dropped, still recorded
        assert 1 <= st["rollout/ds_rounds"] <= 2
        assert all(g.is_replay or 0 < g.successes < 4 for g in groups)  # none of them trained
        assert sum(g.is_replay for g in groups) == sum(r for r, _ in recorded)  # experiential groups are never dropped
        assert len(recorded) == len(groups) + equal
        if st["rollout/ds_rounds"] < 2:
            assert len(groups) == 8  # refilled to the full batch
    plain = tiny(tmp_path, f"buffer.replay_ratio={ratio}", "data.max_questions=48", name="plain")
    trained.clear()
    first, _, _ = run(plain, 1, verify=by_question)
    assert first[0]["rollout/ds_dropped_groups"] == first[0]["rollout/ds_rounds"] == 0 and len(trained[0]) == 8


@pytest.mark.parametrize("level, mode, cap", [("token", "truncate", 2.0), ("sequence", "mask", 1.2),
                                              ("sequence", "truncate", 1.2)])
def test_fresh_rows_get_the_configured_importance_weights_and_both_ratios_are_logged(tmp_path, monkeypatch, level,
                                                                                       mode, cap):
    cfg = tiny(tmp_path, "rollout.rescore=always", f"loss.tis_cap={cap}", f"loss.is_level={level}",
               f"loss.is_mode={mode}")
    torch.manual_seed(0)
    s = open_session(cfg, verify=some_right)
    generate, optimise, batches = s.team.generate, s.team.optimise, []

    def shifted(*a, **kw):  # a sampler 0.1 nats below the trainer on every token: token ratio ~1.105
        gens = generate(*a, **kw)
        for group in gens:
            for g in group:
                g.logprobs = [x - 0.1 for x in g.logprobs]
        return gens

    monkeypatch.setattr(s.team, "generate", shifted)
    monkeypatch.setattr(s.team, "optimise", lambda batch, **kw: (batches.append(batch), optimise(batch, **kw))[1])
    try:
        stats = [loop.run_iteration(s) for _ in range(3)]
    finally:
        s.close()
    batch, st = batches[-1], stats[-1]
    fresh = (~batch.is_replay).nonzero().flatten().tolist()
    lengths = batch.response_mask.sum(1)
    seq = torch.exp(0.1 * lengths.double())  # the sequence ratio, up to the trainer's own rounding
    masked = 0
    for i in fresh:
        w = batch.tis_weights[i][batch.response_mask[i]].double()
        if level == "token":
            want = torch.full_like(w, math.exp(0.1))
        elif mode == "truncate":
            want = torch.full_like(w, min(seq[i].item(), cap))
        else:
            want = torch.full_like(w, seq[i].item() if seq[i] <= cap else 0.0)
            masked += int((want == 0).sum())
        torch.testing.assert_close(w, want, atol=1e-3, rtol=1e-3)
    assert all(bool((batch.tis_weights[i] == 1).all()) for i in batch.is_replay.nonzero().flatten().tolist())
    assert st["is/fresh_seq_ratio_mean"] > math.exp(0.1) - 1e-3  # every fresh sequence has >= 1 token
    assert st["is/masked_fraction"] == (masked / int(lengths[fresh].sum()) if mode == "mask" else 0.0)
    assert (masked > 0) == (mode == "mask")  # responses of 2+ tokens pass the 1.2 cap: masked whole
    assert st["select/replayed_samples"] > 0 and st["is/replay_seq_ratio_mean"] > 0
    assert all(x["is/replay_seq_ratio_mean"] == 0 for x in stats if x["select/replayed_samples"] == 0)


def test_a_resumed_dynamic_sampling_run_draws_the_questions_of_an_unbroken_one(tmp_path):
    def questions(cfg, steps, resume_after=None):
        torch.manual_seed(0)
        s = open_session(cfg, verify=by_question)
        try:
            for _ in range(steps):
                loop.run_iteration(s)
                s.save()
                if s.step == resume_after:
                    s.close()
                    s = open_session(cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": "must"})}),
                                     verify=by_question)
            with s.store.engine.connect() as conn:
                return conn.execute(text("select g.step, q.uid from group_results g join question_states q on "
                                         "q.run_id = g.run_id and q.question_id = g.question_id order by g.id")).all()
        finally:
            s.close()

    knobs = ("rollout.dynamic_sampling=true", "data.max_questions=48")
    unbroken = questions(tiny(tmp_path / "a", *knobs), 4)
    resumed = questions(tiny(tmp_path / "b", *knobs), 4, resume_after=2)
    assert len(unbroken) > 4 * 8 and resumed == unbroken  # refills happened, the sampler's position was kept
