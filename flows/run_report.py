"""What a training flow run shows in Prefect and which links tie it to MLflow and the dashboard.

- task runs named by stage and 1-based step (`rollout step 12`), as the progress lines count;
- the per-step line `exgrpo train` prints, in the flow run's logs (sent to the API only: the CLI
  prints its own);
- a progress artifact over the steps, and a markdown artifact with the run's summary and links to its
  MLflow run, the experiment and the dashboard page;
- tags for the MLflow run pointing back: the Prefect flow run (id, name, URL), git commit, command line
  (for a flow run a worker started, the deployment run that started it, not Prefect's engine module).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.logging.handlers import APILogHandler
from prefect.runtime import deployment as current_deployment, flow_run as current_flow_run

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_ENV = "EXGRPO_DASHBOARD_URL"
DASHBOARD_DEFAULT = "http://127.0.0.1:8501"  # `exgrpo dashboard`'s default address

_steps_log = logging.getLogger("exgrpo.flow_steps")
if not _steps_log.handlers:
    _steps_log.addHandler(APILogHandler())
    _steps_log.setLevel(logging.INFO)
    _steps_log.propagate = False  # the API only: the terminal gets the CLI's own line


def step_line(step: int, total: int, m: dict) -> str:
    """The per-step progress line (0-based `step` shown 1-based)."""
    return (f"step {step + 1:>4}/{total} | reward {m.get('rollout/reward_mean', 0):.3f} "
            f"| fresh pass@1 {m.get('rollout/fresh_pass1', 0):.3f} "
            f"| buffer {int(m.get('buffer/questions', 0))} q / {int(m.get('buffer/trajectories', 0))} traj "
            f"| retired {int(m.get('buffer/retired_questions', 0))} "
            f"| replay {'on ' if m.get('buffer/replay_active') else 'off'} "
            f"({int(m.get('select/replayed_samples', 0))}) "
            f"| loss {m.get('loss/total', 0):+.4f} | {m.get('perf/iteration_s', 0):.1f} s")


def stage_name(stage: str, step: int) -> str:
    """Task run name of a stage at 0-based `step` (`rollout step 12`); a negative step is the start."""
    return f"{stage} step {step + 1}" if step >= 0 else f"{stage} at start"


def artifact_key(run_name: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a run name."""
    return "exgrpo-" + (re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run")


def dashboard_url(run_id: str) -> str:
    return f"{os.environ.get(DASHBOARD_ENV, DASHBOARD_DEFAULT).rstrip('/')}/?run={run_id}"


def git_commit() -> str | None:
    """HEAD of the checkout the code runs from, with `-dirty` when tracked files changed; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def flow_run_url() -> str | None:
    """The flow run's page in the Prefect UI (PREFECT_UI_URL, else the API's address without `/api`)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.utilities.urls import url_for

    run_id = current_flow_run.get_id()
    api = os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()
    base = api.rstrip("/").removesuffix("/api") if api else None
    return url_for("flow-run", obj_id=run_id, default_base_url=base) if run_id else None


def link_tags(cli_equivalent: str | None) -> dict[str, str]:
    """MLflow run tags naming where the run came from. `mlflow.source.git.commit` is MLflow's own key
    (shown as the run's source version); a `-dirty` suffix goes to `exgrpo.git_dirty` instead."""
    commit = git_commit()
    tags = {"prefect.flow_run_id": current_flow_run.get_id(), "prefect.flow_run_name": current_flow_run.get_name(),
            "prefect.flow_run_url": flow_run_url(), "prefect.deployment_id": current_deployment.id,
            "exgrpo.command": launch_command(),
            "exgrpo.cli_equivalent": cli_equivalent}
    if commit:
        tags["mlflow.source.git.commit"] = commit.removesuffix("-dirty")
        tags["exgrpo.git_dirty"] = str(commit.endswith("-dirty")).lower()
    return {k: str(v) for k, v in tags.items() if v}


_ENGINES = ("prefect/engine.py", "prefect.engine", "prefect/flow_engine.py", "prefect.flow_engine")


def launch_command() -> str | None:
    """The command that started this process; for a flow run a worker or runner started (`python -m
    prefect.engine`), the deployment run that started it."""
    if not sys.argv:
        return None
    argv0 = Path(sys.argv[0])
    if not str(argv0).endswith(_ENGINES):
        return shlex.join([argv0.name, *sys.argv[1:]])
    dep = current_deployment.name
    if dep:
        return shlex.join(["prefect", "deployment", "run", f"{current_flow_run.get_flow_name()}/{dep}"])
    return f"python -m prefect.engine (flow run {current_flow_run.get_name()}, no deployment)"


def cli_equivalent(preset: str, sets: list[str]) -> str:
    """`exgrpo train` command that trains what a form run trains."""
    return shlex.join(["exgrpo", "train", "--config", preset, *[a for s in sets for a in ("--set", s)]])


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def duration(seconds: float) -> str:
    """`42 s`, `3 m 05 s`, `2 h 07 m`."""
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.0f} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def _headline(m: dict) -> list[str]:
    """pass@1, then each pass@k the evaluation has (the metrics its table reports)."""
    return sorted((k for k in m if k.startswith("pass@") and k[5:].isdigit()), key=lambda k: int(k[5:]))


def eval_lines(final: dict | None, start: dict | None, step: int) -> list[str]:
    """One line per suite of the final evaluation (and the average, the ID / OOD averages when there are
    several), the step-0 score beside each metric when the run evaluated its starting policy."""
    from exgrpo_core.evaluation.evaluate import AVERAGE, GROUP_AVERAGES, group_averages

    if not final:
        return ["final evaluation: off (--set eval.final=true evaluates the suites after the last step)"]
    start = start or {}
    rows = [(b, m, start.get(b, {})) for b, m in final.items() if b != AVERAGE]
    if len(rows) > 1:
        now, then = (group_averages({b: m["pass@1"] for b, m in x.items() if b != AVERAGE and "pass@1" in m})
                     for x in (final, start))
        rows += [(GROUP_AVERAGES[g].replace("_", " "), {"pass@1": v},
                  {"pass@1": then[g]} if g in then else {}) for g, v in now.items()]
        rows.append((AVERAGE, final.get(AVERAGE, {}), start.get(AVERAGE, {})))
    lines = []
    for name, m, m0 in rows:
        size = (f" ({_n(int(m['questions']), 'question')} x {_n(int(m['samples']), 'sample')})"
                if "questions" in m else "")
        scores = ", ".join(f"{k} {_pct(m[k])}" + (f" (step 0: {_pct(m0[k])})" if k in m0 else "")
                           for k in _headline(m))
        lines.append(f"final eval at step {step}: {name}{size} {scores}")
    return lines


def look_commands(*, tracker_uri: str, mlflow_url: str, db_url: str, run_id: str) -> dict[str, str]:
    """Shell lines that open the run in MLflow and in the dashboard (credentials masked: `***` is filled
    back in from the environment, redact.reveal_url)."""
    from exgrpo_core.config.redact import mask_text

    uri, db = mask_text(tracker_uri), mask_text(db_url)
    if tracker_uri.startswith(("http://", "https://")):
        mlflow_line = f"open {mask_text(mlflow_url)}"
    else:
        mlflow_line = f"{shlex.join(['mlflow', 'ui', '--backend-store-uri', uri])}  # then open {mlflow_url}"
    dash = shlex.join(["exgrpo", "dashboard", "--db-url", db, "--mlflow-uri", uri])
    return {"mlflow": mlflow_line, "dashboard": f"{dash}  # then open {dashboard_url(run_id)}"}


def _n(count: int, word: str, plural: str = "") -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def summary_lines(summary: dict, prefect: bool = True, command_s: float | None = None) -> list[str]:
    """What a finished run found and how to look at it: the CLI's last lines, the summary artifact's
    text. `prefect=False` leaves out the flow run's page (Prefect's ephemeral API has none);
    `command_s`: the whole command's time, shown beside the flow's."""
    lines = [f"done: run {summary['run_id']} ({summary['steps']} steps), MLflow run {summary['mlflow_run_id']}, "
             f"run dir {summary['run_dir']}"]
    lines += eval_lines(summary.get("eval"), summary.get("eval_start"), summary["steps"])
    pool = summary.get("pool")
    if pool:
        traj = _n(pool["trajectories"], "trajectory", "trajectories")
        lines.append(f"replay pool: {_n(pool['questions'], 'question')} / {traj}; "
                     f"retired: {_n(pool['retired'], 'question')}")
    if summary.get("wall_s") is not None:
        first = summary.get("first_step") or 0
        notes = ([f"this session: steps {first + 1}-{summary['steps']}"] if first else []) + (
            [f"{duration(command_s)} with the command's start"] if command_s is not None else [])
        lines.append(f"wall time: {duration(summary['wall_s'])} in the training flow"
                     + (f" ({'; '.join(notes)})" if notes else ""))
    look = summary.get("look") or {}
    if look.get("mlflow"):
        lines.append(f"MLflow:    {look['mlflow']}")
    if look.get("dashboard"):
        lines.append(f"dashboard: {look['dashboard']}")
    if prefect and look.get("prefect"):
        lines.append(f"Prefect:   {look['prefect']}")
    return lines


class FlowRunReport:
    """Progress and summary artifacts plus per-step log lines of one training flow run."""

    def __init__(self, run_name: str, total: int):
        self.run_name, self.total = run_name, total
        self.key = artifact_key(run_name)
        self.progress_id = None

    def links_markdown(self, tracker, run_id: str) -> str:
        parts = [f"[MLflow run]({tracker.run_url})", f"[MLflow experiment]({tracker.experiment_url})",
                 f"[dashboard]({dashboard_url(run_id)})"]
        text = " · ".join(parts)
        if not tracker.uri.startswith(("http://", "https://")):
            text += f" (local MLflow store: start `mlflow ui --backend-store-uri {tracker.uri}` first)"
        return text

    def start(self, first_step: int, tracker, run_id: str) -> None:
        """The progress artifact at `first_step`: this flow run's own when an earlier attempt made one (a
        Retry moves that bar on instead of leaving the killed attempt's beside a new one), else a new one."""
        progress, key = 100.0 * first_step / self.total, f"{self.key}-progress"
        description = (f"Training `{self.run_name}`: share of its {self.total} steps done. "
                       + self.links_markdown(tracker, run_id))
        self.progress_id = _earlier_progress_artifact(key)
        if self.progress_id is not None:
            update_progress_artifact(self.progress_id, progress, description=description)
        else:
            self.progress_id = create_progress_artifact(progress=progress, key=key, description=description)

    def step(self, step: int, stats: dict) -> None:
        """Log the step's line to the flow run and move the progress artifact."""
        _steps_log.info(step_line(step, self.total, stats))
        if self.progress_id is not None:
            update_progress_artifact(self.progress_id, 100.0 * (step + 1) / self.total)

    def summary(self, *, summary: dict, cfg, tracker, checkpoint: dict | None, pictures: str | None) -> None:
        """The markdown artifact of a finished run."""
        m = summary.get("last_metrics") or {}
        rows = [("status", f"finished, {summary['steps']} of {cfg.run.steps} steps"),
                ("preset / model", f"{cfg.preset} / `{cfg.model.name_or_path}`"),
                ("run id / folder", f"`{summary['run_id']}` / `{summary['run_dir']}`"),
                ("replay", "active" if summary.get("replay_active") else "never switched on"),
                ("last step", step_line(summary["steps"] - 1, cfg.run.steps, m) if m else "(no step trained now)")]
        lines = summary_lines(summary)
        rows += [("final evaluation", line.split(": ", 1)[1]) for line in lines if line.startswith("final ")]
        rows += [(k, line.split(": ", 1)[1]) for line in lines for k in ("replay pool", "wall time")
                 if line.startswith(k + ": ")]
        if checkpoint:  # two rows: one cell holding both pushed the 64-digit hash out of view
            rows += [("checkpoint", f"`{checkpoint['path']}`"),
                     ("checkpoint manifest SHA-256", f"`{checkpoint['manifest_sha256']}`")]
        if pictures:
            rows.append(("pictures", f"MLflow artifacts `{pictures}` (entropy, buckets, replays)"))
        text = "\n".join(summary_lines(summary))
        self._markdown(f"# ExGRPO run `{self.run_name}`", rows, self.links_markdown(tracker, summary["run_id"])
                       + f"\n\n## Summary\n\n```\n{text}\n```")
        for line in text.splitlines():  # the flow run's logs end with it too (the API only)
            _steps_log.info(line)

    def nothing_trained(self, message: str, mlflow_run_id: str | None, run_id: str | None) -> None:
        rows = [("status", "already finished: nothing trained"), ("why", message)]
        if mlflow_run_id:
            rows.append(("MLflow run", f"`{mlflow_run_id}`"))
        links = f"[dashboard]({dashboard_url(run_id)})" if run_id else ""
        self._markdown(f"# ExGRPO run `{self.run_name}`: nothing trained", rows, links)

    def _markdown(self, title: str, rows: list[tuple[str, str]], links: str) -> None:
        lines = [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]  # the first row heads the table
        table = "\n".join([lines[0], "|---|---|", *lines[1:]])
        create_markdown_artifact(f"{title}\n\n{table}\n\n{links}\n", key=self.key,
                                 description=f"ExGRPO run {self.run_name}")


def _earlier_progress_artifact(key: str):
    """The id of this flow run's latest progress artifact with this key (made by an earlier attempt of the
    same flow run, before a Retry); None outside a flow run or when there is none."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    flow_run_id = current_flow_run.id
    if not flow_run_id:
        return None
    with get_client(sync_client=True) as client:
        mine = ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        found = client.read_artifacts(artifact_filter=mine, sort=ArtifactSort.CREATED_DESC, limit=1)
    return found[0].id if found and found[0].type == "progress" else None
