"""Dashboard pages in AppTest across runs and with page state: Buffer and Entropy overlay two runs (their
charts hold each run's own numbers), bucket views and metrics are picked and kept in the URL, a clicked
question opens, trajectories filter, and a training run turns on auto-refresh."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from streamlit import dataframe_util

from streamlit.testing.v1 import AppTest
from test_pages import APP, metrics_of, open_page, shown_text

from dashboard import links, queries as Q
from exgrpo_core import metrics as M


def chart_data(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    """(Vega-Lite spec, its data) of every chart on the page, in page order."""
    out = []
    for c in at.get("vega_lite_chart"):
        frames = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in c.proto.datasets]
        out.append((json.loads(c.proto.spec), pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()))
    return out


def titled(at: AppTest, words: str) -> pd.DataFrame:
    found = [df for spec, df in chart_data(at) if words in json.dumps(spec)]  # a layer's title, too
    assert found, f"no chart titled {words!r}"
    return found[0]


def open_with(params: dict[str, str], page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.query_params.update(params)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def test_buffer_overlays_two_runs_with_their_own_numbers(dashboard_env):
    t = dashboard_env
    ex, on = t.ids["exgrpo"], t.ids["on-policy"]
    at = open_with({"overlay": f"{ex},{on}"}, "buffer")
    assert [m.value for m in at.metric if m.label == "replay on since step"] == [
        str(M.step_number(t.one("select replay_started_step from runs where id=:r", r=ex))), "never"]
    for rid in (ex, on):
        shown = titled(at, f"{t.sql('select name from runs where id=:r', r=rid)[0][0]}: questions per bucket")
        ks = set(shown["k"].dropna())  # (the replay-start rule's row has no k)
        assert ks and ks <= set(range(1, 8))  # k = 0 and k = K hidden by default
    table = next(d.value for d in at.dataframe if "target" in d.value.columns)
    mine = table[table.run.str.startswith("exgrpo")]
    got = Q.replay_buckets(t.db_url, ex)
    assert dict(zip(mine.k, mine.replayed)) == {**{k: 0 for k in range(1, 8)}, **dict(zip(got.k, got.replayed))}
    assert mine["share"].sum() == pytest.approx(1) and mine["target"].sum() == pytest.approx(1)
    assert table[table.run.str.startswith("on-policy")]["replayed"].sum() == 0

    at.toggle(key="buffer.ends").set_value(True).run()
    at.radio(key="buffer.buckets").set_value("stacked").run()
    shown = titled(at, "exgrpo: questions per bucket")
    assert {0, 8} <= set(shown["k"].dropna())
    assert at.query_params["ends"] == "1" and at.query_params["buckets"] == "stacked"
    assert at.query_params["overlay"] == f"{ex},{on}"


def test_buffer_opens_with_the_options_in_its_url(dashboard_env):
    at = open_with({"overlay": dashboard_env.ids["exgrpo"], "ends": "1", "buckets": "stacked"}, "buffer")
    assert at.toggle(key="buffer.ends").value is True and at.radio(key="buffer.buckets").value == "stacked"
    assert len(metrics_of(at)) == 4  # one run


def test_entropy_overlay_draws_each_runs_buckets_from_its_own_data(dashboard_env):
    t = dashboard_env
    ex, on = t.ids["exgrpo"], t.ids["on-policy"]
    at = open_with({"overlay": f"{ex},{on}", "steps": "1-4"}, "entropy")  # step numbers: stored 0-3
    assert at.slider[0].value == (1, 4)
    violins = titled(at, "entropy by the k")
    bands = violins[violins["mark"] == "bin"]
    for rid in (ex, on):
        name = t.sql("select name from runs where id=:r", r=rid)[0][0]
        expect = t.sql("select g.k, count(*), min(t.entropy), max(t.entropy) from trajectories t join group_results g "
                       "on g.run_id=t.run_id and g.question_id=t.question_id and g.step=t.collected_step where "
                       "t.run_id=:r and t.step between 0 and 3 and t.entropy is not null group by g.k", r=rid)
        mine = bands[bands.run.str.startswith(f"{name} (")]
        assert {int(g): int(n) for g, n in mine.groupby("group")["n"].sum().items()} == {k: n for k, n, _, _ in expect}
        for k, _, lo, hi in expect:
            drawn = mine[mine.group == str(k)]
            assert drawn["y0"].min() == pytest.approx(lo) and drawn["y1"].max() == pytest.approx(hi)
    stats = at.dataframe[2].value
    assert set(stats.columns) >= {"run", "group", "min", "max"} and stats.run.nunique() == 2
    at.slider[0].set_range(2, 5).run()
    assert at.query_params["steps"] == "2-5"


def test_results_lets_the_user_pick_the_metrics(dashboard_env):
    at = open_page("results")
    at.multiselect(key="results.curves").set_value([M.BUFFER_QUESTIONS]).run()
    assert not at.exception
    shown = titled(at, M.BUFFER_QUESTIONS)
    assert set(shown["key"]) == {M.BUFFER_QUESTIONS} and shown["run"].nunique() == 2
    assert at.query_params["curves"] == M.BUFFER_QUESTIONS
    at.selectbox(key="results.mlflow_metric").set_value(M.REWARD_MEAN).run()
    assert not titled(at, f"{M.REWARD_MEAN} (MLflow)").empty
    assert at.query_params["mlflow_metric"] == M.REWARD_MEAN


def test_links_to_mlflow_and_prefect(monkeypatch):
    assert links.mlflow_run_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning")  # model training, not GenAI
    assert links.mlflow_run_url("sqlite:///x/mlflow.db", "3", "abc") is None
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert links.prefect_flow_run({"prefect.flow_run_id": "f-1"}) == ("f-1", "http://127.0.0.1:4200/runs/flow-run/f-1")
    assert links.prefect_flow_run({"prefect.flow_run_url": "http://p/runs/flow-run/9", "prefect.flow_run_id": "9"}) \
        == ("9", "http://p/runs/flow-run/9")
    assert links.prefect_flow_run({}) == (None, None)


def test_experience_browser_opens_the_clicked_question_and_filters_trajectories(dashboard_env):
    t = dashboard_env
    rid = t.ids["exgrpo"]
    at = open_page("experience", rid)
    rows = at.dataframe[0].value
    at.session_state["question_table"] = {"selection": {"rows": [2], "columns": [], "cells": []}}
    at.run()
    uid = rows.uid.iloc[2]
    heading = at.get("html")[0].proto.body  # the question's heading, prompt and answer: escaped HTML
    assert f"Question {uid}</h3>" in heading and at.query_params["q"] == uid
    qid = t.one("select question_id from question_states where run_id=:r and uid=:u", r=rid, u=uid)
    steps = [M.step_number(s) for (s,) in t.sql("select distinct collected_step from trajectories where run_id=:r and "
                                 "question_id=:q order by 1 desc", r=rid, q=qid)]
    shown = [int(e.label.split(" · ")[0].removeprefix("step ")) for e in at.expander if e.label.startswith("step ")]
    assert shown and shown == steps[:len(shown)]  # one section per group, newest first
    at.selectbox(key="experience.correct").set_value("incorrect").run()
    n = t.one("select count(*) from trajectories where run_id=:r and question_id=:q and reward <= 0", r=rid, q=qid)
    assert (f"**{n} stored trajectories**" in shown_text(at)) if n else ("matches these filters" in shown_text(at))
    at.toggle(key="experience.all").set_value(True).run()
    assert f"{t.one('select count(*) from question_states where run_id=:r', r=rid)} questions match" in shown_text(at)


def test_a_training_run_turns_on_auto_refresh(exgrpo_running):
    at = open_page("buffer", exgrpo_running.ids["exgrpo"])
    assert "refreshes every 10 s" in shown_text(at)
    at.sidebar.toggle(key="buffer.live").set_value(False).run()
    assert "refreshes every" not in shown_text(at) and at.query_params["live"] == "0"
    assert "refreshes every" not in shown_text(open_page("buffer", exgrpo_running.ids["on-policy"]))  # finished
