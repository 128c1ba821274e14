"""The Staleness page on runs with rollout.overlap (issue 47): each step's fresh-batch staleness is charted
beside the replayed trajectories' age, from the run's own `rollout/fresh_staleness`, and the caption counts
the batches dropped as older than `rollout.max_staleness`."""

from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_pages import APP, shown_text
from test_pages_cross_run import titled

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.store.experience_store import ExperienceStore

SMALL = ["rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
         "buffer.start_threshold=0", "data.max_questions=24", "run.steps=3", "rollout.overlap=1"]
BOTH = "age of the fresh batch and replayed trajectories per step"


def half_right(texts, answers):
    return [(1.0, "correct") if i % 3 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`ahead` (overlap 1, replay on from the start) and `dropping` (max_staleness 0: every batch sampled ahead is
    dropped and sampled again), 3 steps each, in one SQLite file."""
    tmp = tmp_path_factory.mktemp("staleness-overlap")
    url = f"sqlite:///{tmp / 'x.db'}"
    ids = {}
    for name, extra in (("ahead", []), ("dropping", ["rollout.max_staleness=0"])):
        torch.manual_seed(0)
        s = open_session(load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url={url}", f"run.name={name}",
                                              *SMALL, *extra]), verify=half_right)
        for _ in range(3):
            loop.run_iteration(s)
        ids[name] = s.run_id
        s.close()
    return url, ids


def page(runs, monkeypatch, name: str) -> AppTest:
    url, ids = runs
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["run_id"] = ids[name]
    at.run()
    at.switch_page("views/staleness.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def logged(runs, name: str, key: str) -> list[float]:
    url, ids = runs
    with ExperienceStore(url) as store:
        return [v for _, v in sorted(store.get_metrics(ids[name], [key])[key])]


def test_fresh_staleness_is_charted_beside_the_replayed_age(runs, monkeypatch):
    at = page(runs, monkeypatch, "ahead")
    data = titled(at, BOTH)
    fresh = data[data.series == "fresh batch"].sort_values("step")
    assert fresh.value.tolist() == logged(runs, "ahead", M.FRESH_STALENESS) == [0.0, 1.0, 1.0]
    assert fresh.step.tolist() == [1, 2, 3]  # step numbers, as the page's other charts
    assert {"mean age", "max age"} <= set(data.series)  # replay was on: its age in the same chart
    text = shown_text(at)
    assert "Fresh batch (`rollout.overlap`)" in text and "(0 in these steps)" in text


def test_the_caption_counts_batches_dropped_as_too_stale(runs, monkeypatch):
    at = page(runs, monkeypatch, "dropping")
    assert logged(runs, "dropping", M.FRESH_DROPPED) == [0.0, 1.0, 1.0]
    fresh = titled(at, "fresh batch")
    assert fresh[fresh.series == "fresh batch"].value.tolist() == [0.0, 0.0, 0.0]  # resampled: on-policy
    assert "(2 in these steps)" in shown_text(at)
