"""The monitor banner (Runs, Buffer pages) and the Staleness page, against the real tiny runs."""

from __future__ import annotations

import json

import pandas as pd
from test_pages import charts, metrics_of, open_page

from dashboard import monitor_queries
from dashboard.monitor_banner import banner_lines
from exgrpo_core import metrics as M


def test_banner_lines_name_each_monitor_its_steps_value_bound_and_action():
    cfg = json.dumps({"monitors": {"iw_max": {"min": None, "max": 50.0, "action": "checkpoint_and_stop"},
                                   "fresh_entropy": {"min": 0.03, "max": 3.0, "action": "warn"}}})
    settings = pd.DataFrame([("r1", "a", "stopped", cfg), ("r2", "b", "running", cfg), ("r3", "c", "finished", cfg)],
                            columns=["id", "name", "status", "config_json"])
    firings = pd.DataFrame([("r1", "monitor/iw_max", 1, 4, 4, 63.2), ("r2", "monitor/fresh_entropy", 3, 2, 9, 0.01),
                            ("r2", "monitor/iw_max", 1, 5, 5, None)],
                           columns=["run_id", "key", "firings", "first_step", "last_step", "last_value"])
    lines = banner_lines(firings, settings)
    assert [level for level, _ in lines] == ["error", "warning"]  # r3 fired nothing: no banner
    assert "stopped by a monitor" in lines[0][1] and "`iw_max` at step 4, last 63.2 > 50 (checkpoint_and_stop)" in lines[0][1]
    assert "`fresh_entropy` at 3 steps (2-9), last 0.01 < 0.03 (warn)" in lines[1][1]
    assert "`iw_max` at step 5, last not finite" in lines[1][1]


def test_firings_query_counts_the_stored_monitor_metrics(dashboard_env):
    t = dashboard_env
    rid = t.ids["exgrpo"]
    got = monitor_queries.monitor_firings(t.db_url, (rid,)).set_index("key")
    raw = t.sql("select key, count(*), min(step), max(step) from step_metrics where run_id=:r and key like "
                "'monitor/%' group by key", r=rid)
    assert raw, "the tiny run's random start should trip fresh_entropy (H ~ log 85 > 3) at step 0"
    for key, n, first, last in raw:
        shown = (got.loc[key, "firings"], got.loc[key, "first_step"], got.loc[key, "last_step"])
        assert shown == (n, first + 1, last + 1)  # step numbers of the stored 0-based steps
        value = t.one("select value from step_metrics where run_id=:r and key=:k and step=:s", r=rid, k=key, s=last)
        assert got.loc[key, "last_value"] == value


def test_runs_and_buffer_pages_show_the_banner(dashboard_env):
    t = dashboard_env
    fired = [k for k, in t.sql("select distinct key from step_metrics where run_id=:r and key like 'monitor/%'",
                               r=t.ids["exgrpo"])]
    for page in ("runs", "buffer"):
        at = open_page(page, t.ids["exgrpo"])
        text = "\n".join(w.value for w in at.warning)
        assert "**exgrpo**" in text and all(f"`{k[len(M.MONITOR_PREFIX):]}`" in text for k in fired), text


def test_runs_page_banners_only_the_selected_runs_in_a_collapsible_box(dashboard_env):
    from streamlit.testing.v1 import AppTest
    from test_pages import APP

    t = dashboard_env
    fired = dict(t.sql("select r.name, count(*) from step_metrics m join runs r on r.id = m.run_id "
                       "where m.key like 'monitor/%' group by r.name"))
    assert set(fired) == {"exgrpo", "on-policy"}, fired  # both random tiny starts trip fresh_entropy
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["run"] = t.ids["on-policy"]  # the Prefect artifact's dashboard link to one run
    at.run()
    assert not at.exception, at.exception
    text = "\n".join(w.value for w in at.warning)
    assert "**on-policy**" in text and "**exgrpo**" not in text, text  # not every run in the database
    (box,) = [e for e in at.expander if e.label.startswith("Monitors fired in 1 of the 1 shown runs")]
    assert [w.value for w in box.warning] == [w.value for w in at.warning]


def test_runs_page_counters_add_up_with_stopped_and_killed_runs(dashboard_env, monkeypatch, tmp_path):
    import shutil

    import sqlalchemy as sa

    t = dashboard_env
    db = tmp_path / "exp.db"
    shutil.copy(t.folder / "exp.db", db)
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:  # one run stopped by a monitor, one killed
        conn.execute(sa.text("update runs set status='stopped' where name='exgrpo'"))
        conn.execute(sa.text("update runs set status='killed' where name='on-policy'"))
    engine.dispose()
    monkeypatch.setenv("EXGRPO_DB_URL", f"sqlite:///{db}")
    from streamlit.testing.v1 import AppTest
    from test_pages import APP

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    shown = metrics_of(at)
    assert shown["runs"] == "2" and shown["stopped"] == "1" and shown["killed"] == "1", shown
    assert sum(int(shown[s]) for s in ("running", "finished", "failed", "stopped", "killed")) == 2


def test_buffer_page_names_a_zero_replay_ratio_as_why_replay_is_off(dashboard_env):
    at = open_page("buffer", dashboard_env.ids["on-policy"])  # replay_ratio=0 (and a threshold no step passes)
    text = "\n".join(i.value for i in at.info)
    assert "Replay is off in this run: `buffer.replay_ratio` is 0" in text and "start_threshold" not in text, text


def test_staleness_page_shows_the_replayed_ages_of_the_database(dashboard_env):
    t = dashboard_env
    rid = t.ids["exgrpo"]
    at = open_page("staleness", rid)
    shown = metrics_of(at)
    n, mean_age, oldest = t.sql("select count(*), avg(r.step - tr.step), max(r.step - tr.step) from replays r "
                                "join trajectories tr on tr.id = r.trajectory_id where r.run_id=:r", r=rid)[0]
    assert shown["replayed trajectories"] == str(n) and n > 0
    assert shown["mean age (steps)"] == f"{mean_age:.2f}" and shown["oldest replayed (steps)"] == str(oldest)
    assert charts(at) == 4  # age heatmap, w quantiles, f(w) quantiles, age per step
    at = open_page("staleness", t.ids["on-policy"])
    assert "replayed no trajectory yet" in at.info[0].value
