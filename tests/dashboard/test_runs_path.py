"""`/runs` opens the Runs page (issue 34 item 9): a browser at `<dashboard>/runs` asks Streamlit for the page
whose URL pathname is `runs`; the root URL (`/?run=ID`, the links training logs) shows Runs as well."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest
from test_pages import APP


def test_runs_has_its_own_url_and_the_root_shows_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_DB_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert [t.value for t in at.title] == ["Runs"]  # the root URL
    pages = {info["url_pathname"]: Path(info["script_path"]).relative_to(Path(APP).parent).as_posix()
             for info in at._registered_pages.values()}  # what Streamlit resolves a URL's pathname against
    assert pages["runs"] == "views/runs.py" and pages[""] == "views/runs.py", pages
    assert {p: s for p, s in pages.items() if p not in ("", "runs")} == {
        p: f"views/{p}.py" for p in ("buffer", "entropy", "staleness", "experience", "results", "what_if", "audit")}
    at.switch_page("views/runs.py").run()
    assert [t.value for t in at.title] == ["Runs"] and not at.exception
