"""Experience reuse across runs: `buffer.warm_start=RUN[,RUN...]` seeds a new run's replay pool from
earlier runs' stored correct trajectories (docs/experience_reuse.md).

`plan_warm_start` finds and checks the source runs and reads their pools (filtered by verifier
version and maximum age) before any model is loaded, so a bad source is one line in seconds; the
session then seeds the new run once, in one transaction (`ExperienceStore.seed_pool`). Sources are
only read. A source is looked up by id, then by name, in this run's database, then in the default
SQLite file of a run of that name (`run.output_dir/NAME/experience.db`).
"""

from __future__ import annotations

from pathlib import Path

from exgrpo_core.config.load import ConfigError
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.reward import audit
from exgrpo_core.reward.grading import GRADERS
from exgrpo_core.store.engine import mask_url, parse_url
from exgrpo_core.store.experience_store import ExperienceStore, question_digest
from exgrpo_core.types import Question

SAME = (("data.train_path", lambda c: c["data"]["train_path"]),
        ("model.name_or_path", lambda c: c["model"]["name_or_path"]))
"""Settings a source run must share: the dataset (question set) and the model (token ids, tokenizer)."""


def accepted_versions(setting: str) -> set[str] | None:
    """`buffer.warm_start_verifier` as a set of verifier versions (None: any, unrecorded included)."""
    if setting == "any":
        return None
    if setting == "current":
        return {audit.version(g) for g in GRADERS}
    return {setting}


def _find(spec: str, store: ExperienceStore | None, output_dir: Path) -> tuple[ExperienceStore, str] | None:
    """(store holding it, run id) of a source named or numbered `spec`, else None."""
    for open_store in (lambda: store, lambda: _default_store(spec, output_dir, store)):  # the second only if needed
        s = open_store()
        if s is None:
            continue
        run_id = spec if s.get_run(spec) else s.find_run_by_name(spec)
        if run_id:
            return s, run_id
        if s is not store:
            s.close()
    return None


def _default_store(name: str, output_dir: Path, store: ExperienceStore | None) -> ExperienceStore | None:
    path = (output_dir / name / "experience.db").resolve()
    if not path.is_file() or (store is not None and str(store.url.database or "") == str(path)):
        return None
    return ExperienceStore(f"sqlite:///{path}")


def plan_warm_start(cfg: ExGRPOConfig, questions: list[Question], db_url: str) -> dict | None:
    """Check the sources of `buffer.warm_start` and read their pools: {"exports": [...], "record": {...}},
    or None for a cold start. ConfigError (one line) for an unknown source, the run itself, or a source
    with another dataset, model, group size or no question in common."""
    b = cfg.buffer
    if not b.warm_start:
        return None
    digests = {question_digest(q) for q in questions}
    versions = accepted_versions(b.warm_start_verifier)
    exports, sources = [], []
    url = parse_url(db_url)
    fresh = url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file()
    store = None if fresh else ExperienceStore(db_url)  # a new SQLite file holds no source: not created here
    try:
        for spec in b.warm_start:
            found = _find(spec, store, Path(cfg.run.output_dir).expanduser())
            if found is None:
                raise ConfigError(f"buffer.warm_start: no run {spec!r} in {mask_url(url)} nor a "
                                  f"{Path(cfg.run.output_dir) / spec / 'experience.db'}")
            src, run_id = found
            try:
                exports.append(_export(cfg, spec, src, run_id, digests, versions))
                sources.append({"run": spec, "run_id": run_id, "database": mask_url(src.url)})
            finally:
                if src is not store:
                    src.close()
    finally:
        if store is not None:
            store.close()
    return {"exports": exports, "record": {"sources": sources, "verifier": b.warm_start_verifier,
                                           "max_age": b.warm_start_max_age}}


def _export(cfg: ExGRPOConfig, spec: str, src: ExperienceStore, run_id: str, digests: set[str],
            versions: set[str] | None) -> dict:
    run = src.get_run(run_id)
    if run["name"] == cfg.run.name:
        raise ConfigError(f"buffer.warm_start: run {spec!r} is this run ({cfg.run.name}); name an earlier run")
    mine = cfg.model_dump()
    for key, get in SAME:
        if get(run["config"]) != get(mine):
            raise ConfigError(f"buffer.warm_start: run {spec!r} has {key}={get(run['config'])!r}, this run "
                              f"{get(mine)!r}: its trajectories do not fit this run")
    if run["group_size"] != cfg.rollout.group_size:
        raise ConfigError(f"buffer.warm_start: run {spec!r} has group_size {run['group_size']}, this run "
                          f"{cfg.rollout.group_size}: its buckets do not fit this run")
    if not src.question_digests(run_id) & digests:
        raise ConfigError(f"buffer.warm_start: run {spec!r} shares no question with this run's dataset "
                          f"({cfg.data.train_path}; a different question set or prompt settings)")
    return src.pool_export(run_id, versions, cfg.buffer.warm_start_max_age)
