"""A run that ends in an error is recorded failed in every service that still answers (issue 35, item 6):
MLflow down must not leave the experience database saying `running`, nor the other way round."""

from __future__ import annotations

from types import SimpleNamespace

from flows.train import _record_end


class _Store:
    def __init__(self, fails: bool = False):
        self.fails, self.updates = fails, []

    def update_run(self, run_id, **fields):
        if self.fails:
            raise RuntimeError("updating run r failed on postgresql://u:***@db/x: connection refused")
        self.updates.append((run_id, fields))


class _Tracker:
    uri = "http://127.0.0.1:5000"

    def __init__(self, fails: bool = False):
        self.fails, self.ended = fails, []

    def end(self, status):
        if self.fails:
            raise ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded\nmore")
        self.ended.append(status)


def test_mlflow_down_still_records_the_run_failed_in_the_database(capsys):
    store, tracker = _Store(), _Tracker(fails=True)
    _record_end(SimpleNamespace(run_id="r", store=store), tracker, "failed")
    assert store.updates == [("r", {"status": "failed"})]
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["could not record run r as failed in MLflow (http://127.0.0.1:5000): "
                   "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded"]


def test_database_down_still_ends_the_mlflow_run(capsys):
    store, tracker = _Store(fails=True), _Tracker()
    _record_end(SimpleNamespace(run_id="r", store=store), tracker, "killed")
    assert tracker.ended == ["KILLED"]
    assert "in the experience database: updating run r failed" in capsys.readouterr().out
