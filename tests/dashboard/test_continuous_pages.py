"""The dashboard reads a continuous-reward run (a real tiny session on the shipped `arith_format` reward):
successes are rollouts above their group's mean, buckets are reward-spread buckets, bucket K is drawable."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import create_engine, text

from dashboard import queries
from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from tests.dashboard.test_pages import open_page, shown_text


@pytest.fixture(scope="module")
def continuous_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("continuous")
    url = f"sqlite:///{folder / 'exp.db'}"
    cfg = load_config("tiny", [f"run.output_dir={folder}", f"run.db_url={url}", "run.name=cont",
                               "reward.fn=arith_format", "buffer.start_threshold=0", "rollout.max_response_tokens=8",
                               "rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4"])
    torch.manual_seed(0)
    s = open_session(cfg)
    try:
        for _ in range(3):
            loop.run_iteration(s)
        run_id = s.run_id
    finally:
        s.close()
    return url, run_id


def _rows(url: str, run_id: str) -> list:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("select id, question_id, collected_step, reward, entropy from trajectories "
                                 "where run_id = :r"), {"r": run_id}).all()
    engine.dispose()
    return rows


def _above_mean(rows) -> dict[int, bool]:
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.question_id, r.collected_step), []).append(r.reward)
    return {r.id: r.reward > sum(groups[(r.question_id, r.collected_step)]) / len(groups[(r.question_id,
                                                                                          r.collected_step)])
            for r in rows}


def test_queries_count_successes_above_the_group_mean(continuous_run):
    url, run_id = continuous_run
    rows = _rows(url, run_id)
    above = _above_mean(rows)
    assert queries.continuous_rewards(url, run_id) and any(0 < r.reward < 1 for r in rows)
    hist = queries.entropy_histogram(url, run_id, 1, 3, "correct", continuous=True)
    counts = hist.groupby("group")["n"].sum().to_dict()
    with_entropy = [r for r in rows if r.entropy is not None]
    assert counts == {k: v for k, v in {
        "above group mean": sum(above[r.id] for r in with_entropy),
        "at or below group mean": sum(not above[r.id] for r in with_entropy)}.items() if v}
    qid = rows[0].question_id
    page, n = queries.question_trajectories(url, run_id, qid, continuous=True)
    assert n == len(page) and dict(zip(page["id"], page["succeeded"])) == {
        r.id: above[r.id] for r in rows if r.question_id == qid}
    good, _ = queries.question_trajectories(url, run_id, qid, correct=True, continuous=True)
    assert set(good["id"]) == {r.id for r in rows if r.question_id == qid and above[r.id]}
    weights, name = queries.target_weights(url, run_id)
    assert name == "gaussian" and sorted(weights) == [1, 2, 3, 4]  # bucket K is drawn with continuous rewards


def test_pages_name_the_continuous_rules(continuous_run, monkeypatch):
    url, run_id = continuous_run
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    buffer = shown_text(open_page("buffer", run_id))
    assert "Reward-spread buckets" in buffer and "Correctness buckets" not in buffer
    entropy = shown_text(open_page("entropy", run_id))
    assert "Above vs at or below the group's mean reward" in entropy
    experience = open_page("experience", run_id)
    box = next(s for s in experience.selectbox if s.label == "trajectories")
    assert box.options == ["any", "above group mean", "at or below group mean"]
