"""The Verifier audit page (AppTest) on a database written through the store: its counts are the rows'."""

from __future__ import annotations

import uuid
from pathlib import Path

from streamlit.testing.v1 import AppTest

from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.types import GroupResult, Question, Rollout

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _rollout(uid: str, reward: float, text: str, reason: str) -> Rollout:
    return Rollout(uid, [1], [5, 6], [-0.5, -0.6], text, False, 0, reward=reward, reason=reason, entropy=0.3,
                   prediction=text[-1], gold="$1$", verifier="math", verifier_version="rules-1+math-verify-0.9.0")


def test_audit_page_counts_graded_rows_timeouts_and_reward_changes(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'exp.db'}"
    with ExperienceStore(url) as s:
        run_id = uuid.uuid4().hex
        s.start_run(run_id, "audited", "tiny", {}, 4)
        s.register_questions(run_id, [Question(u, ({"role": "user", "content": u},), "1") for u in ("a", "b")])
        groups = [GroupResult("a", [_rollout("a", 1.0, "= 1", "correct"), _rollout("a", 0.0, "= 2", "wrong"),
                                    _rollout("a", 0.0, "slow 1", "timeout"), _rollout("a", 1.0, "so 1", "correct")]),
                  GroupResult("b", [_rollout("b", 0.0, f"= {i}", "wrong") for i in range(2, 6)])]
        s.apply_buffer_update(run_id, 0, groups, group_size=4, collect=True, collect_min_k=1, collect_max_k=3,
                              retire=True, store_all=True)
        s.update_run(run_id, step=0)
        regraded = next(r for r in s.stored_trajectories(run_id) if r["verify_reason"] == "wrong")
        s.apply_reward_changes(run_id, [dict(id=regraded["id"], old=0.0, new=1.0, prediction="1", gold="$1$",
                                             verifier="math", verifier_version="rules-2", verify_timed_out=False,
                                             verify_reason="correct")])
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("views/audit.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    shown = {m.label: m.value for m in at.metric}
    assert shown == {"stored trajectories": "8", "verifier timeouts": "1", "verifier versions": "2",
                     "reward changes": "1"}
    by = at.dataframe[0].value
    assert sorted(zip(by["version"], by["trajectories"])) == [("rules-1+math-verify-0.9.0", 7), ("rules-2", 1)]
    assert list(at.dataframe[1].value["new"]) == [1.0]
    assert len(at.dataframe[2].value) == 8


def _page(url: str, monkeypatch) -> str:
    monkeypatch.setenv("EXGRPO_DB_URL", url)
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("views/audit.py").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    return "\n".join(str(e.value) for kind in (at.info, at.markdown, at.caption) for e in kind)


def test_audit_page_explains_an_empty_database_and_one_before_the_audit_columns(tmp_path, monkeypatch):
    from alembic import command

    from exgrpo_core.store.engine import _alembic_config, create_store_engine, parse_url

    empty, url = f"sqlite:///{tmp_path / 'empty.db'}", f"sqlite:///{tmp_path / 'old.db'}"  # pages cache by URL
    ExperienceStore(empty).close()
    assert "No runs yet" in _page(empty, monkeypatch)
    with ExperienceStore(url) as s:
        s.start_run(uuid.uuid4().hex, "old", "tiny", {}, 4)
    cfg, engine = _alembic_config(), create_store_engine(parse_url(url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005")
    engine.dispose()
    assert "predates the verifier audit (revision 0006): run `exgrpo db upgrade`" in _page(url, monkeypatch)
