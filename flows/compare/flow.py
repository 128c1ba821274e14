"""Prefect comparison flow: on-policy GRPO vs ExGRPO and the paper's ablations as child training runs.

One MLflow parent run (the comparison) with a nested run per (arm, seed); the children are the train
flow run as subflows, one after the other, with the same data, seed and B*K rollout slots per step.
Afterwards every child is read back from its database, the budget is checked step by step, and the
table and plots become artifacts of the parent run. Arms: flows/compare/arms.py; docs/comparison.md.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from pydantic.json_schema import SkipJsonSchema

from exgrpo_core.algorithm import selection
from exgrpo_core.config.load import load_config
from exgrpo_core.config.redact import hide
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url
from flows.compare import parallel as par, report
from flows.compare.arms import ArmName, ArmRun, build_arm_runs, can_evaluate, parse_arms, parse_seeds, rollout_slots
from flows.compare.parallel import finished_summary
from flows.param_secrets import scrub_this_flow_run
from flows.run_report import artifact_key, link_tags
from flows.task_args import whole
from flows.tracking import MlflowRun, check_server, open_store, resolve_tracking_uri
from flows.train import train
from flows.train_params import Count, Text, Texts

_task = task(cache_policy=NO_CACHE, persist_result=False)


@_task
def collect(run: ArmRun, summary: dict) -> dict:
    """Read one finished child back from its experience database (and its eval/ folder)."""
    store = ExperienceStore(resolve_db_url(run.cfg.run.db_url, summary["run_dir"]))
    try:
        out = report.arm_result(store, summary["run_id"], run.arm, run.seed, rollout_slots(run.cfg), run.paper_id_avg,
                                eval_dir=Path(summary["run_dir"]) / "eval", target_weights=_target_weights(run.cfg))
    finally:
        store.close()
    out["row"]["mlflow_run_id"] = summary["mlflow_run_id"]
    return out


@_task
def write_report(results: list[dict], out_dir: str, name: str, meta: dict) -> dict[str, str]:
    return report.write_report(results, Path(out_dir), name, meta)


@flow(name="exgrpo-compare", log_prints=True)
def compare(preset: str = "tiny", overrides: Texts = [], arms: list[ArmName] | SkipJsonSchema[None] = [],  # noqa: B006
            seeds: list[int] = [0], evaluate: bool = True, name: Text = "",  # noqa: B006
            parallel: bool = False, work_pool: Text = "", work_queue: str = par.QUEUE,
            slots: Count = 0, retry_failed: bool = False, deployment: str = par.DEPLOYMENT) -> dict:
    """Train every arm x seed (the paper's ablation arms, DEFAULT_ARMS, when `arms` is None), evaluate, and write the
    comparison table.

    `overrides` apply to every arm; the arm's own overrides win. `name` (default `compare-<preset>`)
    names the parent MLflow run and prefixes the child runs, so rerunning resumes them. Empty `arms`,
    `name`, `work_pool` and 0 `slots` are not set (the run form's plain inputs).

    Args:
        parallel: Run the children at once as flow runs of `deployment` on its work pool (flows/compare/parallel.py)
            instead of one after another in this process.
        work_pool: The pool the children must run on (checked against the deployment's pool).
        work_queue: The pool's queue the children go to (created when missing).
        slots: Concurrency limit set on that queue: children running at once (one per GPU).
        retry_failed: Resubmit only the children whose latest run failed, crashed or was cancelled.
        deployment: The training deployment children run as.
    """
    scrub_this_flow_run({"overrides": overrides})  # a password typed into the form (children get it masked)
    name, arms = name or f"compare-{preset}", arms or None
    runs = build_arm_runs(preset, overrides, arms, seeds, name, evaluate)  # bad arm/override: ConfigError now
    target = par.Target(deployment, work_pool or None, work_queue, slots or None, retry_failed) if parallel else None
    if target:
        par.prepare(target)  # no server, deployment or pool as named: one line, before the MLflow parent
    base = load_config(preset, [*(overrides or []), f"run.name={name}"])
    check_server(resolve_tracking_uri(base))
    parent = MlflowRun(base, _find_parent(base, name), tags={"exgrpo.comparison": name, "exgrpo.preset": preset,
                                                             "exgrpo.arms": ",".join(parse_arms(arms)),
                                                             **link_tags(None)})  # Prefect flow run, git
    try:
        results = []
        out_dir = Path(base.run.output_dir).resolve() / name
        meta = _meta(base, preset, overrides, arms, seeds, name, evaluate, runs, target)
        runs = sorted(runs, key=lambda r: parse_seeds(seeds).index(r.seed))  # seed-major, arms in order
        if target:  # all children at once on the pool's workers; read back from the database when all ended
            children = [par.Child(r.arm, r.seed, r.cfg, r.overrides, r.paper_id_avg, _target_weights(r.cfg))
                        for r in runs]
            results = par.run_children(children, target, name, preset, parent.run_id)
            meta["notes"].append(par.note(results, target))  # where the children came from
        for i, run in enumerate([] if target else runs):
            summary = finished_summary(run.cfg)
            print(f"arm {run.arm} seed {run.seed}: run {run.cfg.run.name}" + (" (finished: read back)" if summary else ""))
            summary = summary or train(preset=preset, config=hide(run.cfg), parent_mlflow_run_id=parent.run_id)
            results.append(whole(collect)(run, summary))
            if i + 1 < len(runs) and runs[i + 1].seed != run.seed:  # a seed's arms are all done: a matched
                whole(write_report)(results, str(out_dir), name, meta)  # partial report, should the rest be cut off
        where = par.report_dir(results, out_dir, name)  # never over a report of finished children only
        paths = whole(write_report)(results, str(where), name, meta)
        for path in paths.values() if where == out_dir else ():  # the parent run keeps that report too
            parent.mlflow.MlflowClient().log_artifact(parent.run_id, path)
        _publish(name, paths["md"], complete=where == out_dir)
        report.check_budget(results)  # after the table is written, so a failure still leaves the numbers
        par.check_finished(results, paths["md"])
        parent.end("FINISHED")
    except BaseException:
        parent.end("FAILED")
        raise
    return {"name": name, "parent_mlflow_run_id": parent.run_id, "files": paths,
            "rows": [r["row"] for r in results], "slots_per_step": rollout_slots(base)}


def _publish(name: str, md_path: str, complete: bool, kind: str = "comparison") -> str:
    """The table on the terminal (not as one huge log line) and as the flow run's markdown artifact
    (`exgrpo-<name>-<kind>`, kind comparison or sweep; `...-incomplete` for a report with unfinished
    children); returns the key."""
    from prefect.artifacts import create_markdown_artifact

    text = Path(md_path).read_text()
    sys.stdout.write(text)
    key = artifact_key(name) + (f"-{kind}" if complete else "-incomplete")
    create_markdown_artifact(text, key=key, description=f"{kind.capitalize()} {name}: {md_path}")
    print(f"{kind} table: {md_path} (Prefect artifact {key})")
    return key


def _target_weights(cfg: ExGRPOConfig) -> dict[int, float]:
    """The arm's bucket weights w(k/K), k = 1..K-1 ({} for a weighting the selection rules do not list)."""
    sel = cfg.selection
    try:
        return selection.bucket_weights(cfg.rollout.group_size, sel.question_weighting, sel.sigma, sel.sigma_unit, sel.mu)
    except selection.SelectionError:
        return {}


def _find_parent(cfg: ExGRPOConfig, name: str, tag: str = "exgrpo.comparison") -> str | None:
    """The MLflow run id of an earlier comparison (or sweep: `tag`) with this name (a rerun continues it)."""
    import mlflow

    uri = resolve_tracking_uri(cfg)
    open_store(uri)  # two comparisons starting at once on a new store: one creates it, the other waits
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(cfg.run.mlflow_experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{tag}` = '{name}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def _meta(base: ExGRPOConfig, preset: str, overrides, arms, seeds, name: str, evaluate: bool,
          runs: list[ArmRun], target: par.Target | None = None) -> dict:
    K, B = base.rollout.group_size, base.train.batch_size
    cmd = ["exgrpo", "compare", "--config", preset, "--name", name, "--arms", ",".join(parse_arms(arms)),
           "--seeds", ",".join(map(str, parse_seeds(seeds))), *sum((["--set", o] for o in overrides or []), []),
           *(par.cli_args(target) if target else [])]
    suites = report.md_escape(base.eval.suites or base.data.eval_path)
    held = (f"final evaluation on {suites}" if evaluate and can_evaluate(base)
            else "no held-out evaluation (no eval.suites / data.eval_path, or evaluate off)")
    notes = [f"Command: `{shlex.join(cmd + ([] if evaluate else ['--no-eval']))}`", "",
             f"Preset `{preset}`, {base.run.steps} steps, B={B} questions x K={K}: every step fills "
             f"B·K={B * K} rollout slots in every arm. Fresh questions get K generated responses, "
             "experiential ones K-1 generated + 1 replayed, so replay arms generate one response less per "
             "experiential question (docs/comparison.md). `budget ok`: at every step the stored groups hold B·K "
             "slots and generated = B·K - experiential groups. `unfilled replay slots`: experiential questions "
             "solved K/K in that step, retired before trajectory selection, so their group trains without the "
             "replayed trajectory (all-correct: zero advantage either way).",
             f"Rewards are the last step's values (`mean reward`: over all steps); {held}.",
             "`slots to on-policy final held-out`: rollout slots trained on (B·K a step in every arm) up to the "
             "first evaluation (eval.every, and the final one) whose held-out pass@1 reached on_policy's final "
             "held-out pass@1 (mean over its seeds); — when it never did, or without evaluations; a mean row is "
             "— when any seed never did. Slots, not generated responses, so a replay arm is not credited with "
             "the response it does not generate per experiential question.",
             "`held-out at step 0`: the starting policy (eval.at_start, stored at step -1); `held-out AUC`: "
             "trapezoid area under held-out pass@1 against steps completed, divided by the steps spanned (the "
             "mean held-out pass@1 over training). The statistics against on_policy follow the table.",
             "`paper ID avg (ref)`: the paper's in-distribution average for Qwen2.5-Math-7B (the paper's ablation table), "
             "a reference for the direction of each ablation, not comparable in scale."]
    return {"preset": preset, "overrides": list(overrides or []), "arms": parse_arms(arms),
            "seeds": parse_seeds(seeds), "steps": base.run.steps, "slots_per_step": B * K,
            "evaluate": evaluate, "command": shlex.join(cmd), "notes": notes,
            "runs": {f"{r.arm}/s{r.seed}": r.cfg.run.name for r in runs}}
