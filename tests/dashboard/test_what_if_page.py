"""The Replay what-if page in Streamlit's AppTest, on a tiny finished run's database: the numbers it shows are the
library's (`exgrpo_core.store.what_if`), re-run on the page or read from the report `exgrpo replay-what-if` wrote."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_pages import APP, metrics_of, shown_text

from dashboard import what_if_data as D
from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.config.load import apply_overrides, build_config, load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.store import what_if as W
from exgrpo_core.store.experience_store import ExperienceStore
from flows.what_if_cli import cmd_what_if

SMALL = ["rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
         "buffer.start_threshold=0", "data.max_questions=24"]
LOW_MU = ["selection.mu=0.25", "selection.sigma=0.5"]


def half_right(texts, answers):
    return [(1.0, "correct") if i % 3 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Runs `wi` (5 steps, replay on) and `on-policy` (2 steps, replay_ratio 0) in one SQLite file; a CLI report
    of `wi` next to it."""
    tmp = tmp_path_factory.mktemp("whatif-page")
    url = f"sqlite:///{tmp / 'x.db'}"
    ids = {}
    for name, steps, extra in (("wi", 5, []), ("on-policy", 2, ["buffer.replay_ratio=0"])):
        cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url={url}", f"run.name={name}", *SMALL, *extra])
        torch.manual_seed(0)
        s = open_session(cfg, verify=half_right)
        for _ in range(steps):
            loop.run_iteration(s)
        ids[name] = s.run_id
        s.close()
    report = tmp / "wi" / "what_if_low_mu.json"
    args = argparse.Namespace(config="tiny", set=[f"run.output_dir={tmp}", *SMALL, *LOW_MU], run="wi", db_url=url,
                              seed=5, out=str(report))
    assert cmd_what_if(args) == 0
    return url, ids, report


@pytest.fixture
def page(tiny, monkeypatch):
    url, ids, _ = tiny
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def open_(run: str) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=180)
        at.session_state["run_id"] = ids[run]
        at.run()
        at.switch_page("views/what_if.py").run()
        assert not at.exception, at.exception
        return at
    return open_


def library(url: str, run_id: str, changes: list[str], seed: int) -> dict:
    with ExperienceStore(url) as store:
        cfg = build_config(apply_overrides(store.get_run(run_id)["config"], changes))
        return W.what_if(store, run_id, cfg, seed=seed)


def frame(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def assert_shows(at: AppTest, report: dict) -> None:
    assert not at.error, [e.value for e in at.error]
    wi, ac = report["what_if"], report["actual"]
    summary = frame(at, "measure").set_index("measure")
    assert summary.loc["replays", D.WHAT_IF] == wi["replays"] and summary.loc["replays", D.RUN] == ac["replays"]
    for row, key in (("distinct questions", "distinct_questions"), ("mean age (steps)", "age_mean"),
                     ("mean entropy", "entropy_mean")):
        assert (summary.loc[row, D.WHAT_IF], summary.loc[row, D.RUN]) == pytest.approx((wi[key], ac[key]))
    buckets = frame(at, "source bucket k").set_index("source bucket k")
    share, theirs, target = ({int(k): v for k, v in d.items()} for d in (wi["share"], ac["share"], wi["target"]))
    assert set(buckets.index) == set(share) | set(theirs) | set(target)
    for k in buckets.index:
        assert (buckets.loc[k, D.WHAT_IF], buckets.loc[k, D.RUN]) == pytest.approx((share.get(k, 0), theirs.get(k, 0)))
        assert buckets.loc[k, "target"] == pytest.approx(target.get(k, 0.0))
    assert metrics_of(at)[f"replays, {D.WHAT_IF}"] == str(wi["replays"])
    assert "None" not in shown_text(at) and "nan" not in shown_text(at)


def test_the_page_re_runs_the_run_s_own_policy_as_the_library_does(tiny, page):
    url, ids, _ = tiny
    at = page("wi")
    want = library(url, ids["wi"], [], seed=0)
    assert_shows(at, want)
    assert want["what_if"]["replays"] > 0 and want["actual"]["replays"] > 0
    steps = frame(at, "gap")
    mine = steps[steps.run == D.WHAT_IF].set_index("step")
    weights = {int(k): v for k, v in want["what_if"]["target"].items()}
    for d in want["per_step"]:  # the what-if's per-step gap: the loop's own target_gap of its draws
        assert mine.loc[M.step_number(d["step"]), "gap"] == pytest.approx(loop.target_gap(d["buckets"], weights))
    with ExperienceStore(url) as store:
        logged = dict(store.get_metrics(ids["wi"], [M.TARGET_GAP])[M.TARGET_GAP])
    theirs = steps[steps.run == D.RUN].set_index("step")["gap"]
    common = [s for s in logged if M.step_number(s) in theirs.index]
    assert common and all(theirs[M.step_number(s)] == pytest.approx(logged[s]) for s in common)  # what the run logged


def test_a_changed_policy_and_seed_show_the_library_s_counterfactual(tiny, page):
    url, ids, _ = tiny
    at = page("wi")
    at.text_area[0].input("\n".join(LOW_MU)).run()
    at.number_input[0].set_value(3).run()
    assert not at.exception, at.exception
    want = library(url, ids["wi"], LOW_MU, seed=3)
    assert want["what_if"] != library(url, ids["wi"], [], seed=0)["what_if"]  # the change shows
    assert_shows(at, want)
    policies = frame(at, "setting").set_index("setting")
    assert policies.loc["selection.mu", D.RUN] == "0.5" and policies.loc["selection.mu", D.WHAT_IF] == "0.25"
    assert policies.loc["buffer.max_age", D.WHAT_IF] == "off"  # a word, not a bare None


def test_the_page_reads_the_report_the_cli_wrote_next_to_the_run(tiny, page):
    url, ids, report = tiny
    at = page("wi")
    at.radio[0].set_value("a report file").run()
    assert next(s for s in at.selectbox if s.label.startswith("Reports")).options == [report.name]
    assert_shows(at, D.report_file(report))
    assert_shows(at, library(url, ids["wi"], LOW_MU, seed=5))  # the same numbers as re-running it


def test_a_change_outside_the_policy_is_one_line_on_the_page(page):
    at = page("wi")
    at.text_area[0].input("selection.mu=0.25\ntrain.lr=1").run()
    assert not at.exception
    assert [e.value for e in at.error] == [("policy change 'train.lr=1': a what-if changes only selection.*, "
                                            "buffer.max_age and buffer.replay_ratio (the run's training stays as "
                                            "it was)")]
    at.text_area[0].input("selection.mu=lots").run()
    assert len(at.error) == 1 and "selection.mu" in at.error[0].value and "\n" not in at.error[0].value


def test_a_run_without_replay_is_explained(page):
    at = page("on-policy")
    assert not at.error and "has replayed nothing: replay is off in this run" in shown_text(at)


def test_a_report_path_of_another_run_or_not_a_report_is_explained(tiny, page, tmp_path):
    _, ids, report = tiny
    other, junk = tmp_path / "other.json", tmp_path / "junk.json"
    other.write_text(json.dumps({**json.loads(report.read_text()), "run_id": ids["on-policy"]}))
    junk.write_text(json.dumps({"run_id": ids["wi"]}))
    at = page("wi")
    at.radio[0].set_value("a report file").run()
    at.text_input[0].input(str(other)).run()
    assert not at.exception and not at.error
    off, wi = ids["on-policy"][:8], ids["wi"][:8]
    want = f"This report is of run {off}, not of wi ({wi}): pick that run in the sidebar."
    assert [w.value for w in at.warning] == [want]
    at.text_input[0].input(str(junk)).run()
    assert len(at.error) == 1 and at.error[0].value.startswith(f"{junk} is not a replay-what-if report")


def test_a_rescored_report_shows_its_per_step_numbers_under_the_checkpoint(tiny, page, tmp_path):
    url, ids, _ = tiny
    path = tmp_path / "rescored.json"
    args = argparse.Namespace(config="tiny", set=[f"run.output_dir={tmp_path}", *SMALL], run="wi", db_url=url, seed=0,
                              out=str(path), rescore="tiny")  # the run's starting weights
    assert cmd_what_if(args) == 0
    rs = json.loads(path.read_text())["rescore"]
    first = [s["seq_log_ratio"] for s in rs["trajectories"].values() if s["sampled_step"] == 0]
    assert first and max(map(abs, first)) < 1e-4  # sampled by these weights: not moved
    at = page("wi")
    at.radio[0].set_value("a report file").run()
    at.text_input[0].input(str(path)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "how far the policy has moved" in shown_text(at) and "`tiny`, at temperature 1" in shown_text(at)
    steps = frame(at, "gap").set_index(["step", "run"])
    assert "token log-ratio" in steps.columns
    for r in rs["per_step"]:
        shown = steps.loc[(M.step_number(r["step"]), D.ARMS[r["arm"]])]
        assert shown["token log-ratio"] == pytest.approx(r["token_log_ratio"])
        assert shown["loss weight"] == pytest.approx(r["weight"])
    plain = frame(at, "measure")  # the summary table stays as without a re-scoring
    assert list(plain.columns) == ["measure", D.WHAT_IF, D.RUN]
