"""`exgrpo train`'s checks of its inputs before Prefect starts, each failure one line (flows/cli.py `_preflight`):
the model, the output folder, the rollout engine, the MLflow store, the experience database's schema, and
on resume that the dataset and the group size are the ones the run trained with."""

from __future__ import annotations

import importlib.util
import sys
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from exgrpo_core.config.load import ConfigError

def _user_errors() -> tuple[type[Exception], ...]:
    from exgrpo_core.models.load import ModelLoadError
    from exgrpo_core.rollout.vllm_engine import VLLMUnavailable
    from flows.tracking import TrackingError

    return ConfigError, ModelLoadError, VLLMUnavailable, TrackingError


USER_ERRORS = _user_errors()  # what these checks raise: one line each
SQLITE_MAGIC = b"SQLite format 3\x00"
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")


def check_before_run_dir(cfg) -> None:
    """What needs no run folder: the model source, the output folder, the engine, the MLflow store."""
    from exgrpo_core.models.check import check_model_source

    check_model_source(cfg.model.name_or_path, cfg.model.tiny.model_dump())
    check_output_dir(cfg.run.output_dir)
    check_engine(cfg.rollout.engine)
    uri = cfg.run.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    check_tracking_uri(uri or f"sqlite:///{Path(cfg.run.output_dir).resolve() / 'mlflow.db'}", given=bool(uri))


def check_form_config(cfg) -> None:
    """A config from the Prefect form, in the flow's first second: what `exgrpo train` checks before Prefect
    starts without reading the data or the database."""
    from exgrpo_core.run.session import check_context

    check_before_run_dir(cfg)
    check_context(cfg)


def check_output_dir(output_dir: str) -> None:
    """run.output_dir must be a folder this process can write in (made if missing)."""
    path = Path(output_dir).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"run.output_dir {output_dir}: {existing} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".exgrpo-write-check-", dir=path)
        shutil.rmtree(probe)
    except OSError as err:
        raise ConfigError(f"run.output_dir {output_dir} cannot hold runs: {err.strerror or err} "
                          f"(in {existing}); pick a folder you can write to") from None


def _has_vllm() -> bool:
    """Whether vLLM can be imported (a module already loaded counts, even one without a spec)."""
    if "vllm" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def check_engine(engine: str) -> None:
    if engine == "vllm" and not _has_vllm():
        from exgrpo_core.rollout.vllm_engine import VLLMUnavailable

        raise VLLMUnavailable("rollout.engine=vllm needs vLLM, which this Python does not have: `pip install "
                              "exgrpo[vllm]` on a CUDA machine, or use rollout.engine=transformers")
    if engine == "remote":
        from exgrpo_core.rollout.remote import require_vllm

        require_vllm()


def check_tracking_uri(uri: str, given: bool = True) -> None:
    """A scheme this MLflow can store runs with; a local SQLite store must be an MLflow SQLite file."""
    from flows.tracking import TrackingError

    name = "run.mlflow_tracking_uri / MLFLOW_TRACKING_URI" if given else "the local MLflow store"
    scheme = urlparse(uri).scheme.split("+")[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise TrackingError(f"{name} {uri!r} is not a tracking URI MLflow can store runs with: use an MLflow "
                            "server (http://host:5000) or a database (sqlite:///path/mlflow.db), or unset it "
                            "for the local store beside the runs")
    if scheme == "sqlite" and uri.startswith("sqlite:///"):
        _check_sqlite_store(Path(uri[len("sqlite:///"):]), name)  # a server is probed later (check_server)


def _check_sqlite_store(db: Path, name: str) -> None:
    if not db.exists():
        return  # the flow creates it
    if not db.is_file():
        raise _tracking_error(f"{name} {db} is a folder, not an SQLite file")
    with open(db, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head and head != SQLITE_MAGIC:
        raise _tracking_error(f"{name} {db} is not an SQLite database (damaged or replaced?): move it aside "
                              "to start a new store, or restore it")
    if head:
        import sqlite3

        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            conn.close()
        except sqlite3.DatabaseError as err:
            raise _tracking_error(f"{name} {db} cannot be read as SQLite ({err}): move it aside to start a "
                                  "new store, or restore it") from None
        if tables and "experiments" not in tables:
            raise _tracking_error(f"{name} {db} is an SQLite database of another application (no MLflow "
                                  "tables): point it at an MLflow store or a new file")


def _tracking_error(message: str):
    from flows.tracking import TrackingError

    return TrackingError(message)


def check_schema(db_url: str) -> None:
    """The experience database is ours (or empty, or missing: created later); engine.check_schema says why not."""
    from exgrpo_core.store.engine import check_schema as schema, create_store_engine, parse_url

    url = parse_url(db_url)
    if url.get_backend_name() == "sqlite" and (url.database in (None, "", ":memory:")
                                               or not Path(url.database).expanduser().is_file()):
        return
    engine = create_store_engine(url)
    try:
        schema(engine)
    finally:
        engine.dispose()


def check_resume(cfg, ckpt: Path | None, questions: list, db_url: str) -> None:
    """Resuming from `ckpt`: the run's questions must all be in the data, with the same content, and
    rollout.group_size must be the run's (its groups, buckets and stored k are counted in it)."""
    if ckpt is None:
        return
    import torch
    from sqlalchemy import select

    from exgrpo_core.run import checkpoint
    from exgrpo_core.run.session import ResumeError
    from exgrpo_core.store.engine import read_connection
    from exgrpo_core.store.experience_store import ExperienceStore, question_digest
    from exgrpo_core.store.tables import QuestionRow, QuestionState

    try:
        state = torch.load(Path(ckpt) / checkpoint.STATE_FILE, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:
        state = checkpoint.load_trainer_state(ckpt)
    run_id = state["loop"]["run_id"]
    with ExperienceStore(db_url) as store:
        row = store.get_run(run_id)
        with read_connection(store.engine, "reading the run's questions") as conn:
            known = dict(conn.execute(select(QuestionState.uid, QuestionRow.digest)
                                      .join(QuestionRow, QuestionRow.id == QuestionState.question_id)
                                      .where(QuestionState.run_id == run_id)).all())
    if row is None:
        return  # check_database has said so
    fix = "continue it with the settings it trained with, or give a new run.name"
    if row["group_size"] != cfg.rollout.group_size:
        raise ResumeError(f"run {cfg.run.name} trained with rollout.group_size={row['group_size']}, this command "
                          f"sets {cfg.rollout.group_size}: {fix}")
    loaded = {q.uid: q for q in questions}
    missing = [u for u in known if u not in loaded]
    changed = [u for u in known if u in loaded and known[u] not in (question_digest(loaded[u]),
                                                                   question_digest(loaded[u], u))]
    if missing or changed:
        parts = ([f"{len(missing)} of its {len(known)} questions are not in it (e.g. {', '.join(missing[:3])})"]
                 if missing else []) + ([f"{len(changed)} have other content (e.g. {', '.join(changed[:3])})"]
                                        if changed else [])
        raise ResumeError(f"the dataset of run {cfg.run.name} changed since it started (data.train_path="
                          f"{cfg.data.train_path}): {'; '.join(parts)}: {fix}")
