"""The Staleness page follows a training run as Buffer does (issue 34 item 8): while the chosen run's status
is running, its body is a fragment redrawn every `ui.TTL_S` seconds, and each redraw reads the run again."""

from __future__ import annotations

from test_pages import open_page, shown_text

from dashboard import ui


def test_staleness_redraws_while_the_run_trains(exgrpo_running):
    at = open_page("staleness", exgrpo_running.ids["exgrpo"])
    # the caption is drawn only where the body goes into st.fragment(run_every=ui.TTL_S) (ui.live)
    assert f"refreshes every {ui.TTL_S} s" in shown_text(at)
    assert [m.label for m in at.metric][:1] == ["replayed trajectories"]  # the body drew inside the fragment
    at.sidebar.toggle(key="staleness.live").set_value(False).run()
    assert "refreshes every" not in shown_text(at) and at.query_params["live"] == "0"
    assert [m.label for m in at.metric][:1] == ["replayed trajectories"]
    at = open_page("staleness", exgrpo_running.ids["on-policy"])  # finished: drawn once
    assert "refreshes every" not in shown_text(at)
