"""Data of the Replay what-if page: the counterfactual of `exgrpo_core.store.what_if` run on the dashboard's
read-only connection, or a JSON report `exgrpo replay-what-if` wrote, as frames for the page."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd

from dashboard import db
from exgrpo_core.algorithm import selection
from exgrpo_core.config.load import apply_overrides, build_config
from exgrpo_core.config.schema import ConfigError, ExGRPOConfig
from exgrpo_core.store import what_if as W
from exgrpo_core.store.experience_store import ExperienceStore

WHAT_IF, RUN = "what if", "the run"
ARMS = {"what_if": WHAT_IF, "actual": RUN}  # a report's sides; an arm of another name shows as its name
RESCORED = {"token_log_ratio": "token log-ratio", "seq_log_ratio": "sequence log-ratio", "weight": "loss weight",
            "entropy": "entropy (checkpoint)", "stored_entropy": "entropy (stored)",
            "lowest_changed": "lowest-entropy changed"}  # a `--rescore` report's per-step means, as columns
POLICY_KEYS = ("selection.", "buffer.max_age", "buffer.replay_ratio")  # what a what-if may change
REPORT_KEYS = {"run_id", "steps", "what_if", "actual", "per_step"}
MAX_REPORT_BYTES = 50_000_000


class ReadOnlyStore(ExperienceStore):
    """The store's readers on the dashboard's read-only engine: no schema upgrade, no writes."""

    def __init__(self, engine):  # skips ExperienceStore.__init__, which migrates the schema
        self.engine = engine
        self.url = engine.url


def parse_changes(text: str) -> list[str]:
    """`key=value` lines (blank lines and `#` comments skipped) -> overrides; DashboardError for a line that
    is not one or changes anything but the replay policy (`selection.*`, `buffer.max_age`, `buffer.replay_ratio`)."""
    out = []
    for line in (x.strip() for x in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        key = line.split("=", 1)[0].strip()
        if "=" not in line or not key:
            raise db.DashboardError(f"policy change {line!r} must look like selection.mu=0.25")
        if not (key.startswith(POLICY_KEYS[0]) or key in POLICY_KEYS[1:]):
            raise db.DashboardError(f"policy change {line!r}: a what-if changes only selection.*, buffer.max_age "
                                    "and buffer.replay_ratio (the run's training stays as it was)")
        out.append(line)
    return out


def policy(run_config: dict, changes: list[str]) -> ExGRPOConfig:
    """The run's own config with `changes` applied: the policy the what-if re-runs."""
    data = copy.deepcopy(run_config)
    try:
        return build_config(apply_overrides(data, changes), source="policy")
    except ConfigError as e:
        raise db.DashboardError(" ".join(str(e).split())) from None  # one line


def compute(url: str, run_id: str, changes: tuple[str, ...], seed: int) -> dict:
    """`what_if` of the run's policy with `changes` on run `run_id` (reads only)."""
    store = ReadOnlyStore(db.readonly_engine(url))
    row = store.get_run(run_id)
    try:
        return W.what_if(store, run_id, policy(row["config"], list(changes)), seed=seed)
    except W.WhatIfError as e:
        raise db.DashboardError(str(e)) from None


def run_replays(url: str, run_id: str) -> list[dict]:
    """What the run replayed, per step (`what_if.actual`): the run's side of the per-step panels."""
    return W.actual(W.read_run(ReadOnlyStore(db.readonly_engine(url)), run_id))


def policy_settings(cfg: ExGRPOConfig) -> dict[str, str]:
    """The settings a what-if may change, as words ("off" for an unset age rule)."""
    sel, off = cfg.selection, "off"
    return {"selection.question_weighting": sel.question_weighting, "selection.mu": f"{sel.mu:g}",
            "selection.sigma": f"{sel.sigma:g} ({sel.sigma_unit})", "selection.trajectory": sel.trajectory,
            "selection.age_half_life": off if sel.age_half_life is None else f"{sel.age_half_life:g} steps",
            "buffer.max_age": off if cfg.buffer.max_age is None else f"{cfg.buffer.max_age} steps",
            "buffer.replay_ratio": f"{cfg.buffer.replay_ratio:g} ({cfg.replay_questions} questions a step)"}


def read_report(text: str, source: str) -> dict:
    """A report `exgrpo replay-what-if` wrote, its bucket keys back to ints; DashboardError if it is not one."""
    try:
        report = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise db.DashboardError(f"{source} is not JSON ({e})") from None
    if not isinstance(report, dict) or not REPORT_KEYS <= set(report):
        raise db.DashboardError(f"{source} is not a replay-what-if report (it lacks {sorted(REPORT_KEYS)})")
    for side in ("what_if", "actual"):
        for part in ("share", "target"):
            report[side][part] = {int(k): v for k, v in report[side][part].items()}
    return report


def report_file(path: str | Path) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise db.DashboardError(f"no report at {p}")
    if p.stat().st_size > MAX_REPORT_BYTES:
        raise db.DashboardError(f"{p} is over {MAX_REPORT_BYTES // 1_000_000} MB: not a what-if report")
    return read_report(p.read_text(errors="replace"), str(p))


def run_folder(run_config: dict, name: str) -> Path:
    """Where `exgrpo replay-what-if` writes its default report: RUN_DIR = run.output_dir / run name."""
    return Path(run_config.get("run", {}).get("output_dir") or ".") / name


def reports_near(folder: Path, run_id: str) -> list[Path]:
    """The what-if reports of run `run_id` in `folder` (JSON files the CLI wrote), by name."""
    found = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            if report_file(p)["run_id"] == run_id:
                found.append(p)
        except (db.DashboardError, OSError, AttributeError, TypeError, ValueError):
            continue
    return found


def bucket_rows(report: dict) -> pd.DataFrame:
    """[run, k, replayed, share, target]: each side's replays by source bucket, and the policy's target."""
    rows = []
    for side, label in (("what_if", WHAT_IF), ("actual", RUN)):
        s = report[side]
        for k in sorted(set(report["what_if"]["share"]) | set(report["actual"]["share"]) | set(s["target"])):
            share = s["share"].get(k, 0.0)
            rows.append({"run": label, "k": k, "replayed": round(share * s["replays"]), "share": share,
                         "target": report["what_if"]["target"].get(k, 0.0)})
    return pd.DataFrame(rows, columns=["run", "k", "replayed", "share", "target"])


def summary_rows(report: dict) -> pd.DataFrame:
    """Replays, distinct questions, mean age and entropy of both sides (the CLI's table)."""
    wi, ac = report["what_if"], report["actual"]
    rows = [("replays", wi["replays"], ac["replays"]),
            ("distinct questions", wi["distinct_questions"], ac["distinct_questions"]),
            ("mean age (steps)", wi["age_mean"], ac["age_mean"]),
            ("mean entropy", wi["entropy_mean"], ac["entropy_mean"])]
    return pd.DataFrame(rows, columns=["measure", WHAT_IF, RUN]).astype({WHAT_IF: float, RUN: float})


gap = selection.target_gap  # the loop's select/target_gap, on one step's replays' source buckets


def total_gap(side: dict, target: dict[int, float]) -> float:
    """`gap` of a whole side of the report (its shares by source bucket) to the target."""
    total = sum(target.values())
    if not side["share"] or total <= 0:
        return 0.0
    keys = set(side["share"]) | set(target)
    return 0.5 * sum(abs(side["share"].get(k, 0.0) - target.get(k, 0.0) / total) for k in keys)


def per_step(report: dict, actual: list[dict]) -> pd.DataFrame:
    """[step, run, replays, gap] per replaying step (step numbers as printed), both sides against the target;
    with a `--rescore` report also its per-step means under the checkpoint (`rescored`)."""
    target = report["what_if"]["target"]
    rows = [{"step": d["step"] + 1, "run": label, "replays": len(d["buckets"]), "gap": gap(d["buckets"], target)}
            for label, draws in ((WHAT_IF, report["per_step"]), (RUN, actual))
            for d in draws]
    out = pd.DataFrame(rows, columns=["step", "run", "replays", "gap"])
    more = rescored(report)
    return out if more is None else out.merge(more, on=["step", "run"], how="left")


def rescored(report: dict) -> pd.DataFrame | None:
    """[step, run, RESCORED columns] of a report written with `--rescore`, per arm and replaying step; None without."""
    rs = report.get("rescore")
    if not isinstance(rs, dict) or not rs.get("per_step"):
        return None
    rows = [{"step": r["step"] + 1, "run": ARMS.get(r["arm"], r["arm"]),
             **{label: r.get(key) for key, label in RESCORED.items()}} for r in rs["per_step"]]
    return pd.DataFrame(rows, columns=["step", "run", *RESCORED.values()]).astype({c: float for c in RESCORED.values()})


def rescored_under(report: dict) -> str:
    """Which policy a `--rescore` report scored under, in words."""
    rs = report["rescore"]
    step = "" if rs.get("step") is None else f" (step {rs['step']})"
    return f"`{rs['checkpoint']}`{step}, at temperature {rs.get('temperature', 1.0):g}"


def distributions(report: dict, actual: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ages [run, age, replays, share] and entropies [run, entropy] of both sides' replays."""
    ages, ents = [], []
    for label, draws in ((WHAT_IF, report["per_step"]), (RUN, actual)):
        ages += [(label, a) for d in draws for a in d["ages"]]
        ents += [(label, e) for d in draws for e in d["entropies"]]
    age = pd.DataFrame(ages, columns=["run", "age"])
    age = age.groupby(["run", "age"], as_index=False).size().rename(columns={"size": "replays"})
    age["share"] = age["replays"] / age.groupby("run")["replays"].transform("sum")
    return age, pd.DataFrame(ents, columns=["run", "entropy"])
