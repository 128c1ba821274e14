"""Prefect sweep flow: a grid of config values x seeds as parallel child runs, one report with the grid as rows.

    exgrpo sweep --config tiny --grid 'train.lr=1e-6,3e-6' --seeds 0-3 --slots 4

Children (flows/compare/grid.py) are flow runs of the `exgrpo-train` deployment, submitted, awaited and
read back as a parallel comparison's are (flows/compare/parallel.py); one MLflow parent run holds them nested
and the report (sweep_<name>.md/.csv/.json and plots) as artifacts; the table is also the flow run's
Prefect artifact `exgrpo-<name>-sweep`. A sweep with unfinished children never replaces a report whose
children all finished: it goes to `incomplete/` (artifact `exgrpo-<name>-incomplete`), as a comparison's
does. A grid of arms (`--grid arm=on_policy,exgrpo`, or any other key) crossed with `--grid train.lr=...`
and 2+ seeds puts the tuned-per-arm comparison first (flows/compare/tuned_report.py): each arm at its own
best learning rate, the winner's curse inside the interval.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from prefect import flow

from exgrpo_core.config.load import load_config
from flows.compare import parallel as par, report, tuned_report
from flows.compare.arms import parse_seeds
from flows.compare.flow import _find_parent, _publish, _target_weights
from flows.compare.grid import build_children
from flows.param_secrets import scrub_this_flow_run
from flows.run_report import link_tags
from flows.tracking import MlflowRun, check_server, resolve_tracking_uri


@flow(name="exgrpo-sweep", log_prints=True)
def sweep(preset: str = "tiny", grid: list[str] = [], overrides: list[str] | None = None,  # noqa: B006
          seeds: list[int] = [0], evaluate: bool = True, name: str | None = None,  # noqa: B006
          work_pool: str | None = None, work_queue: str = par.QUEUE, slots: int | None = None,
          retry_failed: bool = False, deployment: str = par.DEPLOYMENT) -> dict:
    """Train every grid point x seed in parallel on the deployment's work pool; write one table.

    Args:
        preset: A preset in configs/ or a YAML path.
        grid: `key=v1,v2` strings; the points are every combination of their values.
        overrides: dotted.key=value strings applied to every child.
        seeds: One child per grid point and seed.
        evaluate: A final held-out evaluation in every child (when the config names held-out data).
        name: The sweep's name (default sweep-<preset>): the MLflow parent run and the children's prefix.
        work_pool: The pool the children must run on (checked against the deployment's pool).
        work_queue: The pool's queue the children go to (created when missing).
        slots: Concurrency limit set on that queue: children running at once (one per GPU).
        retry_failed: Resubmit only the children whose latest run failed, crashed or was cancelled.
        deployment: The training deployment children run as.
    """
    scrub_this_flow_run({"overrides": overrides, "grid": grid})  # a password typed in (children get it masked)
    name = name or f"sweep-{preset}"
    children = build_children(preset, overrides, grid, seeds, name, evaluate)
    target = par.Target(deployment, work_pool, work_queue, slots, retry_failed)
    par.prepare(target)  # no server, deployment or pool as named: one line, before the MLflow parent
    for c in children:
        c.target_weights = _target_weights(c.cfg)
    base = load_config(preset, [*(overrides or []), f"run.name={name}"])
    check_server(resolve_tracking_uri(base))
    parent = MlflowRun(base, _find_parent(base, name, "exgrpo.sweep"),
                       tags={"exgrpo.sweep": name, "exgrpo.preset": preset, "exgrpo.grid": " ; ".join(grid),
                             **link_tags(None)})  # Prefect flow run, git commit, command
    try:
        results = par.run_children(children, target, name, preset, parent.run_id)
        out_dir = Path(base.run.output_dir).resolve() / name
        where = par.report_dir(results, out_dir, name, prefix="sweep")  # never over a report of finished children
        meta = _meta(base, preset, grid, overrides, seeds, name, evaluate, target)
        meta["notes"].append(par.note(results, target, "sweep"))  # where the children came from
        paths = write_sweep_report(results, where, name, meta)
        for path in paths.values() if where == out_dir else ():  # the parent run keeps that report too
            parent.mlflow.MlflowClient().log_artifact(parent.run_id, path)
        _publish(name, paths["md"], complete=where == out_dir, kind="sweep")
        par.check_finished(results, paths["md"])
        parent.end("FINISHED")
    except BaseException:
        parent.end("FAILED")
        raise
    return {"name": name, "parent_mlflow_run_id": parent.run_id, "files": paths,
            "rows": [r["row"] for r in results]}


def write_sweep_report(results: list[dict], out_dir: Path, name: str, meta: dict) -> dict[str, str]:
    """The sweep's report; when its grid is arms x learning rates x 2+ seeds, the tuned-per-arm section
    comes first (after the command) and its numbers go to the JSON under `tuned`."""
    done = [r["row"] for r in results if r["row"].get("status", "finished") == "finished"]
    tuned = tuned_report.section(done, meta["grid"])
    if tuned:
        notes = meta["notes"]
        meta = {**meta, "tuned": tuned["analysis"], "notes": [*notes[:1], "", *tuned["markdown"], "", *notes[1:]]}
    elif why := tuned_report.why_no_section(done, meta["grid"]):  # arms x rates, but not computable: say why
        meta = {**meta, "notes": [*meta["notes"][:1], "", why, "", *meta["notes"][1:]]}
    return report.write_report(results, out_dir, name, meta, prefix="sweep")


def _meta(base, preset: str, grid: list[str], overrides, seeds, name: str, evaluate: bool,
          target: par.Target) -> dict:
    cmd = ["exgrpo", "sweep", "--config", preset, "--name", name, *sum((["--grid", g] for g in grid), []),
           "--seeds", ",".join(map(str, parse_seeds(seeds))), *sum((["--set", o] for o in overrides or []), []),
           *par.cli_args(target), *([] if evaluate else ["--no-eval"])]
    B, K = base.train.batch_size, base.rollout.group_size
    notes = [f"Command: `{shlex.join(cmd)}`", "",
             f"Preset `{preset}`, {base.run.steps} steps, B={B} x K={K}; one row per grid point and seed, and a "
             "mean row per grid point over its finished seeds. Rewards are the last step's values (`mean reward`: "
             "over all steps); held-out columns come from the final evaluation when the config names held-out data."]
    return {"title": "Sweep", "row_label": "grid point", "skip_columns": ["slots_to_target", "paper_id_avg"],
            "preset": preset, "grid": list(grid),
            "overrides": list(overrides or []), "seeds": parse_seeds(seeds), "steps": base.run.steps,
            "evaluate": evaluate, "command": shlex.join(cmd), "notes": notes}
