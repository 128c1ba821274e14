"""Stored text is shown inert: a question, gold answer or trajectory holding a Markdown image, a raw <img>
and links is shown as text in real headless chromium, and the browser requests nothing from the URLs in it
(a local HTTP server counts the requests)."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from urllib.parse import urlencode

import pytest
import sqlalchemy as sa

from dashboard import queries as Q
from tests.dashboard.test_browser import _screenshots_module

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args):
        pass


def _hostile(port: int, where: str) -> str:
    base = f"http://127.0.0.1:{port}"
    return (f"{where}: ![x]({base}/{where}-md.png) and <img src=\"{base}/{where}-raw.png\"> and "
            f"[a link]({base}/{where}-link) and <a href=\"{base}/{where}-a\">raw</a> {base}/{where}-bare")


def _poison(db_url: str, run_id: str, port: int) -> str:
    """Give a question with stored trajectories hostile text everywhere: its uid, prompt, gold answer and
    trajectories; returns its uid."""
    first, _ = Q.search_questions(db_url, run_id, rolled_out=True, limit=1)
    qid = int(first.question_id[0])
    uid = f"uid-![u](http://127.0.0.1:{port}/uid-md.png)"  # a dataset's uid is shown too (the header)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("update question_states set uid=:u where run_id=:r and question_id=:q"),
                     dict(u=uid, r=run_id, q=qid))
        conn.execute(sa.text("update questions set text=:t, answer=:a where id=:q"),
                     dict(t=_hostile(port, "question"), a="7` " + _hostile(port, "answer") + " `", q=qid))
        conn.execute(sa.text("update trajectories set text=:t where run_id=:r and question_id=:q"),
                     dict(t=_hostile(port, "trajectory") + " so \\boxed{7}", r=run_id, q=qid))
    engine.dispose()
    return uid


def test_stored_markdown_and_html_fetch_nothing_and_stay_visible(trained, tmp_path):
    from selenium.webdriver.common.by import By

    shots = _screenshots_module()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    shutil.copy(trained.folder / "exp.db", tmp_path / "exp.db")
    db_url = f"sqlite:///{tmp_path / 'exp.db'}"
    rid = trained.ids["exgrpo"]
    uid = _poison(db_url, rid, port)
    dash_port = shots.free_port()
    proc = shots.start_dashboard(db_url, trained.mlflow_uri, dash_port, tmp_path / "dashboard.log")
    driver = shots.chromium()
    try:
        text = shots.open_page(driver, f"http://127.0.0.1:{dash_port}", "experience", None,
                               query=urlencode(dict(run=rid, text="uid-", q=uid)))
        driver.implicitly_wait(0)
        links = [a.get_attribute("href") for a in driver.find_elements(By.TAG_NAME, "a")]
        images = [i.get_attribute("src") for i in driver.find_elements(By.TAG_NAME, "img")]
        time.sleep(3)  # anything the page would load has had time to arrive
    finally:
        driver.quit()
        shots.stop(proc)
        server.shutdown()
    assert "stored trajectories" in text and _Counter.hits == []
    outside = f"127.0.0.1:{port}"
    assert not [u for u in links + images if u and outside in u], (links, images)
    assert f"Question {uid}" in text
    for where in ("question", "answer", "trajectory"):  # every piece is still readable as the text it is
        assert f"![x](http://{outside}/{where}-md.png)" in text, text[:3000]
        assert f'<img src="http://{outside}/{where}-raw.png">' in text
        assert f"[a link](http://{outside}/{where}-link)" in text
