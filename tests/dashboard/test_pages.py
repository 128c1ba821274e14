"""Each dashboard page in Streamlit's AppTest, against the real tiny runs: the numbers shown are the database's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamlit.testing.v1 import AppTest

from dashboard.highlight import answer_span
from exgrpo_core import metrics as M

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def open_page(page: str, run_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    if run_id:
        at.session_state["run_id"] = run_id
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def metrics_of(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def shown_text(at: AppTest) -> str:
    parts = [e.value for kind in (at.markdown, at.caption, at.info, at.warning, at.subheader, at.title) for e in kind]
    return "\n".join(str(p) for p in parts)


def charts(at: AppTest) -> int:
    return len(at.get("vega_lite_chart")) + len(at.get("arrow_vega_lite_chart"))


def last_metric(trained, run: str, key: str) -> float:
    return trained.one("select value from step_metrics where run_id=:r and key=:k order by step desc limit 1",
                       r=trained.ids[run], k=key)


def test_runs_page_lists_both_runs_with_their_metrics(dashboard_env):
    t = dashboard_env
    at = open_page("runs")
    assert metrics_of(at)["runs"] == "2" and metrics_of(at)["finished"] == "2"
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["exgrpo", "steps"] == 8 and table.loc["on-policy", "steps"] == 5
    assert table.loc["exgrpo", "reward"] == pytest.approx(last_metric(t, "exgrpo", M.REWARD_MEAN))
    assert table.loc["on-policy", "replay"] == False  # noqa: E712 - numpy bool
    assert table.loc["on-policy", "replay since step"] == "never"  # a word, not a bare None
    start = t.one("select replay_started_step from runs where name='exgrpo'")
    assert table.loc["exgrpo", "replay since step"] == str(M.step_number(start))
    assert charts(at) == 2  # reward and pass@1 of the selected runs


def test_buffer_page_shows_the_last_step_and_replay_start(dashboard_env):
    t = dashboard_env
    at = open_page("buffer", t.ids["exgrpo"])
    shown = metrics_of(at)
    assert shown["pool questions"] == f"{last_metric(t, 'exgrpo', M.BUFFER_QUESTIONS):.0f}"
    assert shown["pool trajectories"] == f"{last_metric(t, 'exgrpo', M.BUFFER_TRAJECTORIES):.0f}"
    assert shown["retired questions"] == f"{last_metric(t, 'exgrpo', M.RETIRED_QUESTIONS):.0f}"
    start = t.one("select replay_started_step from runs where name='exgrpo'")
    assert shown["replay on since step"] == str(M.step_number(start))  # stored 0-based
    assert charts(at) == 7  # pool questions, pool trajectories, buckets, replays vs target, 2 weights, replayed
    now = next(d.value for d in at.dataframe if "pooled" in d.value.columns)
    assert now["questions"].sum() == t.one("select count(*) from question_states where run_id=:r", r=t.ids["exgrpo"])


def test_buffer_page_explains_a_run_without_replay(dashboard_env):
    at = open_page("buffer", dashboard_env.ids["on-policy"])
    assert metrics_of(at)["replay on since step"] == "never"
    assert "Replay is off in this run: `buffer.replay_ratio` is 0" in shown_text(at)  # the cause, not the threshold
    assert "no importance weights" in shown_text(at)
    text = shown_text(at)  # the reason replay holds for this run, not "yet" (it never will replay)
    assert "has replayed nothing: replay is off in it (`buffer.replay_ratio` is 0)." in text
    assert "replayed nothing yet" not in text and "None" not in text


def _stats(at: AppTest, i: int) -> dict[str, int]:
    df = at.dataframe[i].value
    return dict(zip(df["group"], df["trajectories"]))


def test_entropy_page_counts_match_the_database_and_follow_the_step_range(dashboard_env):
    t = dashboard_env
    rid = t.ids["exgrpo"]
    at = open_page("entropy", rid)
    assert at.slider[0].value == (1, 8)  # step numbers; stored 0-7

    def expected(lo, hi):
        by_reward = dict(t.sql("select case when reward > 0 then 'correct' else 'incorrect' end, count(*) from "
                               "trajectories where run_id=:r and step between :a and :b and entropy is not null "
                               "group by 1", r=rid, a=lo, b=hi))
        replayed = t.one("select count(*) from replays where run_id=:r and step between :a and :b", r=rid, a=lo, b=hi)
        return by_reward, replayed

    for lo, hi in ((1, 8), (3, 6)):
        if (lo, hi) != (1, 8):
            at.slider[0].set_range(lo, hi).run()
            assert not at.exception
        by_reward, replayed = expected(lo - 1, hi - 1)
        assert _stats(at, 0) == by_reward
        assert _stats(at, 1).get("replayed", 0) == replayed > 0
        assert sum(_stats(at, 2).values()) == sum(by_reward.values())  # by bucket: every trajectory once
    assert charts(at) == 4


def test_entropy_page_on_a_run_without_replay(dashboard_env):
    at = open_page("entropy", dashboard_env.ids["on-policy"])
    text = shown_text(at)  # replay_ratio 0 is the reason (the threshold would stop it too)
    assert "Nothing was replayed in this step range: replay is off in this run (`buffer.replay_ratio` is 0)." in text
    assert "This run has not replayed any trajectory: replay is off in it (`buffer.replay_ratio` is 0)" in text
    assert "yet" not in text.split("This run has not replayed any trajectory", 1)[1][:20] and "None" not in text


def test_experience_browser_filters_and_shows_a_question(dashboard_env):
    t = dashboard_env
    rid = t.ids["exgrpo"]
    at = open_page("experience", rid)
    total = t.one("select count(*) from question_states where run_id=:r and n_groups > 0", r=rid)
    assert f"{total} questions match" in shown_text(at)  # only rolled-out questions by default
    # default order: most replayed first; the page opens that question
    uid, k, groups, replayed, qid = t.sql(
        "select uid, latest_k, n_groups, times_replayed, question_id from question_states where run_id=:r "
        "and n_groups > 0 order by times_replayed desc, uid limit 1", r=rid)[0]
    shown = metrics_of(at)
    assert shown["latest k"] == f"{k} / 8" and shown["groups"] == str(groups)
    assert shown["times replayed"] == str(replayed)
    stored = t.one("select count(*) from trajectories where run_id=:r and question_id=:q", r=rid, q=qid)
    assert f"**{stored} stored trajectories**" in shown_text(at)
    prompt, *html = [h.proto.body for h in at.get("html")]  # the question's prompt and answer, then trajectories
    assert f"Question {uid}</h3>" in prompt and "<b>Prompt:</b>" in prompt and "<b>Ground truth:</b>" in prompt
    shown_rows = t.sql("select reward, text from trajectories where run_id=:r and question_id=:q "
                       "order by collected_step desc, id desc limit :n", r=rid, q=qid, n=len(html))
    assert html and len(shown_rows) == len(html)
    for (reward, text), h in zip(shown_rows, html):  # newest group first; the graded answer marked, green or red
        span = answer_span(text)
        assert ("<mark" in h) == (span is not None), (text, h)
        assert span is None or ("#b7ebc6" in h) == (reward > 0), (text, reward, h)

    retired_box = next(s for s in at.selectbox if s.label == "retired")
    retired_box.select("yes").run()
    n_retired = t.one("select count(*) from question_states where run_id=:r and retired and n_groups > 0", r=rid)
    assert f"{n_retired} questions match" in shown_text(at)
    assert at.query_params["retired"] == "yes"


def test_results_page_shows_evaluations_curves_and_mlflow_side_by_side(dashboard_env):
    t = dashboard_env
    at = open_page("results")
    evals = at.dataframe[0].value.set_index("step")
    for step, value in t.sql("select step, value from eval_results where run_id=:r and benchmark='tiny-arith' "
                             "and metric='pass@1'", r=t.ids["exgrpo"]):
        assert evals.loc[M.step_number(step), "tiny-arith"] == pytest.approx(value)
    mlflow = at.dataframe[1].value.set_index("mlflow_name")
    assert set(mlflow.index) == {"exgrpo", "on-policy"}
    assert mlflow.loc["on-policy", "buffer.replay_ratio"] == "0.0"  # the parameter that differs is shown
    assert not at.warning
    assert charts(at) >= 4  # per-benchmark curves, reward, pass@1, MLflow average pass@1
    links = at.dataframe[2].value.set_index("run")  # each run's MLflow run (a local store has no web page)
    for name, mlflow_id in t.sql("select name, mlflow_run_id from runs"):
        row = links.loc[[r for r in links.index if r.startswith(f"{name} (")][0]]
        assert row["MLflow run"] == mlflow_id and row["MLflow page"] is None


PAGES = ["runs", "buffer", "entropy", "experience", "results"]


@pytest.mark.parametrize("page", PAGES)
def test_pages_explain_an_empty_database(page, tmp_path, monkeypatch):
    from exgrpo_core.store.experience_store import ExperienceStore

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    ExperienceStore(url).close()  # schema, no runs
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    at = open_page(page)
    assert "No runs yet" in shown_text(at)


@pytest.mark.parametrize("url, message", [
    ("sqlite:///{tmp}/missing.db", "no experience database at"),
    ("mysql://root@localhost/x", "unknown database dialect"),
    ("postgresql+psycopg://postgres@127.0.0.1:9/none", "cannot connect to the experience database"),
])
def test_pages_explain_an_unusable_database(url, message, tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_DB_URL", url.format(tmp=tmp_path))
    for page in ("runs", "buffer"):
        at = AppTest.from_file(APP, default_timeout=180)
        at.run()
        if page != "runs":
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
        assert any(message in e.value for e in at.error), [e.value for e in at.error]


def test_results_page_says_when_mlflow_cannot_be_read(dashboard_env, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'nothing' / 'mlflow.db'}")
    at = open_page("results")
    assert any(re.search("MLflow cannot be read.*no MLflow store", w.value) for w in at.warning)
    assert not at.exception


def test_results_page_explains_a_run_without_evaluations(dashboard_env):
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["run_ids"] = [dashboard_env.ids["on-policy"]]
    at.run()
    at.switch_page("views/results.py").run()
    assert not at.exception and not at.error
    assert "No evaluation results for these runs yet" in shown_text(at)
    assert charts(at) >= 2  # the training curves are still there
