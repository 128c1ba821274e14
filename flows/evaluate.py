"""Prefect evaluation flow: a model, a checkpoint, or a training run's latest checkpoint on benchmark suites.

A checkpoint of a training run attaches its results to that run (database run id and MLflow run,
at the checkpoint's step; the MLflow run is not reopened, so its status and end time stay); a bare
model (`model` or the config's `model.name_or_path`) gets an evaluation-only run `eval-<model>` in both.
Settings come from the config's `eval` section.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from prefect import flow

from exgrpo_core import metrics as M
from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.config.redact import masked_config
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.models import load as models
from exgrpo_core.reward.grading import MathVerifier
from exgrpo_core.run import allocator, checkpoint as C
from exgrpo_core.store.experience_store import ExperienceStore, StoreError, resolve_db_url
from flows.eval_tasks import START_STEP, generation_args, load_items, record, run_eval
from flows.param_secrets import scrub_this_flow_run
from flows.task_args import whole
from flows.tracking import MlflowRun, check_server, resolve_tracking_uri
from flows.train_params import Text, Texts


@dataclass
class Target:
    """What is evaluated: weights at `source`; run ids when they come from a training run's checkpoint.
    `step`: the 0-based step index it is stored at: the checkpoint's last step, or START_STEP (-1, step 0)
    for a bare model, which no update has touched."""

    source: str
    label: str
    run_dir: Path
    step: int = START_STEP
    run_id: str | None = None
    mlflow_run_id: str | None = None


def resolve_target(cfg: ExGRPOConfig, model: str | None, checkpoint: str | None, run: str | None) -> Target:
    """At most one of model / checkpoint dir / run name; none means the config's model."""
    if sum(x is not None for x in (model, checkpoint, run)) > 1:
        raise ConfigError("evaluate takes one of model, checkpoint or run (got more than one)")
    if run is not None:
        run_dir = Path(cfg.run.output_dir).resolve() / run
        ckpt = C.latest_checkpoint(run_dir)
        if ckpt is None:
            raise ConfigError(f"run {run!r} has no checkpoint in {C.checkpoint_dir(run_dir)} "
                              "(set run.output_dir to the folder that holds the run)")
        checkpoint = str(ckpt)
    if checkpoint is not None:
        ckpt = Path(checkpoint).expanduser().resolve()
        if not (ckpt / C.STATE_FILE).is_file():
            if not ckpt.is_dir():
                raise ConfigError(f"checkpoint {checkpoint}: no such directory")
            model = str(ckpt)  # a plain model folder (save_policy): evaluate it as a bare model
        else:
            loop = C.load_trainer_state(ckpt)
            return Target(str(ckpt), ckpt.parent.parent.name, ckpt.parent.parent, loop["step"],
                          loop["loop"]["run_id"], loop["loop"].get("mlflow_run_id"))
    source = model or cfg.model.name_or_path
    label = "eval-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(source).name or source).strip("-")
    return Target(source, label, Path(cfg.run.output_dir).resolve() / label)


@flow(name="exgrpo-evaluate", log_prints=True)
def evaluate(preset: str = "tiny", overrides: Texts = [], model: Text = "", checkpoint: Text = "",  # noqa: B006
             run: Text = "", suites: Texts = [], config: ExGRPOConfig | None = None) -> dict:  # noqa: B006
    """Evaluate on `suites` (default: eval.suites, else data.eval_path); returns ids, step number and scores.

    `preset`/`overrides` build the config (`config`, when given, is used as is); `model` is a name or
    path, `checkpoint` a checkpoint folder, `run` a run name under run.output_dir (latest checkpoint);
    empty ones are not set (the run form's plain inputs).
    """
    scrub_this_flow_run({"overrides": overrides, "config": config})  # a password typed into the form
    cfg = config or load_config(preset, overrides or [])
    if suites:
        cfg = cfg.model_copy(deep=True)
        cfg.eval.suites = list(suites)
    items = load_items(cfg)  # a bad suite fails before any model is loaded
    if not items:
        raise ConfigError("nothing to evaluate: pass suites, or set eval.suites or data.eval_path")
    check_server(resolve_tracking_uri(cfg))
    target = resolve_target(cfg, model or None, checkpoint or None, run or None)
    target.run_dir.mkdir(parents=True, exist_ok=True)
    store = ExperienceStore(resolve_db_url(cfg.run.db_url, target.run_dir))
    try:
        run_id = _db_run(store, cfg, target)
        tags = {"exgrpo.run_id": run_id, "exgrpo.kind": "evaluate" if target.run_id is None else "train"}
        tracker = MlflowRun(cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": target.label})}),
                            target.mlflow_run_id, tags=tags, reopen=False)  # a training run keeps its end
        if target.run_id is None:
            store.update_run(run_id, mlflow_run_id=tracker.run_id)
        previous_malloc = allocator.use(cfg.run.malloc)
        try:
            policy, tokenizer = models.load_policy(target.source, dtype=cfg.model.dtype,
                                                   tiny=cfg.model.tiny.model_dump(), seed=cfg.run.seed,
                                                   warm_start=cfg.model.warm_start.model_dump(),
                                                   hf_overrides=cfg.model.hf_overrides)
            if torch.cuda.is_available():
                policy = policy.cuda()
            with MathVerifier(cfg.reward.timeout_s, cfg.reward.require_think, cfg.reward.workers) as v:
                report = whole(run_eval)(policy, tokenizer, items, v.verify, generation_args(cfg))
            summary = whole(record)(report, store=store, run_id=run_id, step=target.step, tracker=tracker,
                                    out_dir=target.run_dir / "eval", label=target.label)
        except BaseException:
            tracker.end("FAILED")
            raise
        finally:
            allocator.use(previous_malloc)
        tracker.end("FINISHED")
    finally:
        store.close()
    step = M.step_number(target.step)  # as MLflow, the checkpoint's folder and the artifacts name it
    return {"label": target.label, "run_id": run_id, "mlflow_run_id": tracker.run_id, "step": step,
            "source": target.source, "eval": summary, "seconds": report.seconds,
            "artifacts": str(target.run_dir / "eval" / f"step_{step:06d}")}


def _db_run(store: ExperienceStore, cfg: ExGRPOConfig, target: Target) -> str:
    """The training run's id (must be in this database), or a new evaluation-only run."""
    if target.run_id is not None:
        if store.get_run(target.run_id) is None:
            raise StoreError(f"run {target.run_id} of checkpoint {target.source} is not in {store!r}; set "
                             "run.db_url to the database the run trained with")
        return target.run_id
    run_id = uuid.uuid4().hex
    store.start_run(run_id, target.label, cfg.preset, {"evaluate": target.source, **masked_config(cfg)},
                    cfg.rollout.group_size)
    store.update_run(run_id, status="finished")  # step -1: no step trained
    return run_id
