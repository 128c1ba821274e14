"""MLflow for training runs: where the store is, one run per training flow run, params and metrics.

Default store: `sqlite:///<output_dir>/mlflow.db` with artifacts beside it, shared by every run in
that output folder so they can be compared; `MLFLOW_TRACKING_URI` or `run.mlflow_tracking_uri`
points at a server instead, which is probed first so that a dead server is a clear error, not a hang.
Several processes may start on one new local store at once: creation is serialised by a file lock,
and a new store is built in a temporary file and renamed into place, so a kill mid-creation leaves none.

The experiment is tagged as model training (`mlflow.experimentKind`); MLflow 3.17's UI itself follows a
global GenAI / model-training switch, so the links built here open the experiment with
`?workflowType=machine_learning`. `log_checkpoint` records the final checkpoint (path, manifest hash,
and on request the model) so a run can be rebuilt from MLflow.

Steps: callers pass the 0-based step index the database stores; MLflow gets its step number
(metrics.step_number: updates done, the start model's evaluation at 0), the one boundary where the two
differ. A run made before that (no `exgrpo.step_numbering` tag) keeps its 0-based steps when continued.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import yaml

from exgrpo_core import metrics as M
from exgrpo_core.config.load import flatten
from exgrpo_core.config.redact import mask_text, masked, masked_config, reveal_url
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.run.locks import file_lock

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # read by MLflow 3's UI: genai_development or this
MODEL_TRAINING = "custom_model_development"
TRAINING_VIEW = "workflowType=machine_learning"  # MLflow 3.17's UI: the model-training view of a page
LOCAL_UI = "http://127.0.0.1:5000"  # what `mlflow ui --backend-store-uri <local store>` serves
# MLflow prints its own run and experiment links (no view parameter: GenAI pages for a fresh browser) when a
# run on a server ends; `MlflowRun.end` prints the run's link with TRAINING_VIEW instead.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
STEP_TAG = "exgrpo.step_numbering"  # on runs whose MLflow steps are step numbers (metrics.step_number)
STEP_NUMBERS = "updates_done"


# An MLflow server that answers 5xx (429, 500, 502, 503, 504) or cannot be reached: MLflow's client retries
# each request after 0, 4, 8, 16, 32 and 64 s (urllib3 Retry, backoff factor 2), about two minutes; then
# the run ends in one line naming the server, exit 4 (flows/dependency_errors.py). A retried log_batch adds
# no point twice (same metric, step, timestamp and value). Set these variables to choose otherwise.
SERVER_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "6", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2"}


class TrackingError(RuntimeError):
    """MLflow cannot be used as configured; the message names the URI and what to do."""


def resolve_tracking_uri(cfg: ExGRPOConfig) -> str:
    """run.mlflow_tracking_uri (a masked password filled in from MLFLOW_TRACKING_URI: redact.reveal_url),
    else MLFLOW_TRACKING_URI, else the local store beside the runs."""
    uri = reveal_url(cfg.run.mlflow_tracking_uri, "MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path(cfg.run.output_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def check_server(uri: str, timeout: float = 5.0) -> None:
    """Fail fast with a readable message when an http(s) tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status != 200:
                raise TrackingError(f"MLflow server at {uri} answered /health with HTTP {resp.status}")
    except (urllib.error.URLError, OSError) as e:
        raise TrackingError(
            f"MLflow tracking server at {uri} is unreachable ({getattr(e, 'reason', e)}). Start it "
            "(see infra/) or unset MLFLOW_TRACKING_URI to use the local store.") from None
    _check_login(uri, timeout)


def _check_login(uri: str, timeout: float) -> None:
    """A server with logins (MLflow's basic-auth app) must take MLFLOW_TRACKING_USERNAME/PASSWORD: one line
    when they are missing or wrong, before any work is done (/health answers without a login)."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if user and password:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        urllib.request.urlopen(req, timeout=max(timeout, 30.0)).close()  # a login check hashes: slow when busy
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise TrackingError(f"MLflow server at {uri} " + (
                f"refused the login of MLFLOW_TRACKING_USERNAME={user}: check MLFLOW_TRACKING_PASSWORD"
                if user and password else "asks for a login: set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (infra/README.md, Logins)")) from None
    except (urllib.error.URLError, OSError):
        pass  # reachable a moment ago: a real fault surfaces, named, on first use


def _creation_lock(uri: str):
    """A file lock beside a local SQLite store (`mlflow.db.lock`) held while MLflow creates or migrates its
    tables and the experiment, which several processes starting at once would otherwise race on."""
    if uri.startswith("sqlite:///"):
        return file_lock(uri[len("sqlite:///"):] + ".lock")
    return contextlib.nullcontext()


def _create_local_store(uri: str) -> None:
    """Build a new local SQLite store in a temporary file and rename it into place (call under the
    creation lock): a kill during MLflow's table creation leaves a stray temporary file, never a
    half-built store that every later start fails on ("table ... already exists")."""
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri[len("sqlite:///"):])
    if db.exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in db.parent.glob(f".{db.name}.*.tmp"):  # left by a start killed mid-creation
        stale.unlink(missing_ok=True)
    tmp = db.with_name(f".{db.name}.{uuid.uuid4().hex}.tmp")  # a new name: MLflow caches engines by URI
    store = SqlAlchemyStore(f"sqlite:///{tmp}", (db.parent / "mlartifacts").as_uri())
    store.engine.dispose()
    os.replace(tmp, db)


def open_store(uri: str) -> None:
    """Make a local SQLite store ready before anything opens it (MlflowClient, get_experiment_by_name):
    several processes opening one new store at once race on MLflow's table creation (alembic errors)."""
    with _creation_lock(uri):
        _create_local_store(uri)


class MlflowRun:
    """Owns the MLflow run of one training flow run (created, or continued on resume)."""

    def __init__(self, cfg: ExGRPOConfig, run_id: str | None, tags: dict[str, str],
                 parent_run_id: str | None = None, reopen: bool = True):
        """`parent_run_id` nests a new run under that run (a comparison's parent; it may be active).
        `reopen=False` records into the existing run `run_id` without reopening it: its status and end
        time stay as they are (`end` does nothing), as for an evaluation of a finished training run."""
        import mlflow

        self.mlflow = mlflow
        uri = resolve_tracking_uri(cfg)
        check_server(uri)
        for k, v in SERVER_RETRIES.items():  # unless set: a server answering 5xx or down rides out ~2 min
            os.environ.setdefault(k, v)
        mlflow.set_tracking_uri(uri)
        self.uri = uri
        with _creation_lock(uri):  # concurrent starts on one new SQLite store: one creates, the others wait
            _create_local_store(uri)
            experiment = mlflow.get_experiment_by_name(cfg.run.mlflow_experiment)
            if experiment is None:
                artifacts = None
                if uri.startswith("sqlite:///"):
                    artifacts = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
                mlflow.create_experiment(cfg.run.mlflow_experiment, artifact_location=artifacts,
                                         tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
            elif EXPERIMENT_KIND_TAG not in experiment.tags:  # made before the tag existed: a training one too
                mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
            self.experiment_id = mlflow.set_experiment(cfg.run.mlflow_experiment).experiment_id
        self.attached = bool(run_id) and not reopen
        if run_id is None:
            tags = {**tags, STEP_TAG: STEP_NUMBERS}
        if self.attached:
            self.run = mlflow.MlflowClient().get_run(run_id)
            self.run_id = run_id
            for k, v in tags.items():
                mlflow.MlflowClient().set_tag(run_id, k, str(v))
        else:
            self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else cfg.run.name, tags=masked(tags),
                                        nested=parent_run_id is not None,
                                        parent_run_id=None if run_id else parent_run_id)
            self.run_id = self.run.info.run_id
        # a run logged before step numbers (no tag) keeps its 0-based MLflow steps when continued
        self.numbered = self.run.data.tags.get(STEP_TAG) == STEP_NUMBERS
        self._logged = self._logged_points() if run_id else set()
        if run_id is None:
            params = {k: ("None" if v is None else str(v))[:6000] for k, v in masked(flatten(cfg)).items()}
            mlflow.log_params(params)
            self.log_text(yaml.safe_dump(masked_config(cfg), sort_keys=False), "config.yaml")

    def _logged_points(self) -> set[tuple[str, int]]:
        """(metric, step) pairs the continued run already holds (a resume replays the steps after its
        checkpoint, some of which were logged before the crash)."""
        client = self.mlflow.MlflowClient()
        return {(key, m.step) for key in self.run.data.metrics
                for m in client.get_metric_history(self.run_id, key)}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log finite numbers of 0-based step index `step` (the database's) at its step number, the MLflow
        step (metrics.step_number; -1, the starting policy, is step 0); a (metric, step) the run already
        holds is left as it is, so a replayed step never adds a second point (its first values stand:
        equal for a bit-exact resume, timings aside)."""
        step = M.step_number(step) if self.numbered else step
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)
                 and (k, step) not in self._logged}
        if not clean:
            return
        if self.attached:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.mlflow.MlflowClient().log_batch(self.run_id, [Metric(k, v, now, step) for k, v in clean.items()])
        else:
            self.mlflow.log_metrics(clean, step=step)
        self._logged.update((k, step) for k in clean)

    def log_text(self, text: str, name: str) -> None:
        if self.attached:
            self.mlflow.MlflowClient().log_text(self.run_id, text, name)
        else:
            self.mlflow.log_text(text, name)

    def log_json(self, obj: dict, name: str) -> None:
        self.log_text(json.dumps(obj, indent=2, default=str), name)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        """Upload every file under local_dir (evaluation tables, plots) into artifact_path."""
        if self.attached:
            self.mlflow.MlflowClient().log_artifacts(self.run_id, str(local_dir), artifact_path)
        else:
            self.mlflow.log_artifacts(str(local_dir), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        if not self.attached:  # a run recorded into without reopening keeps its own status and end time
            self.mlflow.end_run(status=status)
            if self.uri.startswith(("http://", "https://")):  # MLflow's own line has no view parameter
                print(f"MLflow run: {self.run_url}")

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags({k: mask_text(str(v))[:5000] for k, v in tags.items() if v is not None})

    @property
    def ui_base(self) -> str:
        """The MLflow web UI of this store: the server itself, or `mlflow ui`'s default address."""
        return self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else LOCAL_UI

    @property
    def experiment_url(self) -> str:
        return f"{self.ui_base}/#/experiments/{self.experiment_id}?{TRAINING_VIEW}"

    @property
    def run_url(self) -> str:
        return f"{self.ui_base}/#/experiments/{self.experiment_id}/runs/{self.run_id}?{TRAINING_VIEW}"

    def log_checkpoint(self, folder: str | Path, with_model: bool = False) -> dict:
        """Record a checkpoint in the run: tags `exgrpo.checkpoint.path` / `.manifest_sha256`, artifacts
        `checkpoint/manifest.json` and `checkpoint/reference.json`; with `with_model` also its model
        (weights, config, tokenizer; not the optimiser) under `model/`. Returns the reference."""
        folder = Path(folder).resolve()
        manifest = folder / "manifest.json"
        ref = {"path": str(folder), "name": folder.name,
               "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None,
               "model_logged": with_model}
        self.set_tags({"exgrpo.checkpoint.path": ref["path"],
                       "exgrpo.checkpoint.manifest_sha256": ref["manifest_sha256"]})
        if manifest.is_file():
            self.mlflow.log_artifact(str(manifest), "checkpoint")
        self.log_json(ref, "checkpoint/reference.json")
        if with_model:
            for p in sorted(folder.iterdir()):
                if p.name in ("trainer_state.pt", "optimizer"):  # resumable state, not the model
                    continue
                if p.is_dir():
                    self.mlflow.log_artifacts(str(p), f"model/{p.name}")
                else:
                    self.mlflow.log_artifact(str(p), "model")
        return ref

