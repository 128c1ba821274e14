"""A comparison's results: one row per child run read back from its experience database, the
rollout-budget check, and the table (Markdown, CSV, JSON) and plots (PNG) written from the rows.

Everything here reads stored metrics (`step_metrics`, `eval_results`), never the flow's in-memory
stats, so a resumed or re-read comparison gives the same table.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from exgrpo_core import metrics as M
from exgrpo_core.evaluation import stats
from exgrpo_core.store.experience_store import ExperienceStore
from flows.compare import stats as compare_stats
from flows.compare.stats import md_escape

CURVE_KEYS = (M.REWARD_MEAN, M.FRESH_PASS1, M.RESPONSES, M.REPLAYED_SAMPLES, M.BUFFER_QUESTIONS,
              M.BUFFER_TRAJECTORIES, M.RETIRED_QUESTIONS)


STALENESS = ((M.REPLAY_AGE_MEAN, "age_mean", "replay age mean"), (M.REPLAY_AGE_MAX, "age_max", "replay age max"),
             (M.REPLAY_W_P50, "w_p50", "w median"), (M.REPLAY_W_P90, "w_p90", "w p90"),
             (M.REPLAY_W_MAX, "w_max", "w max"), (M.REPLAY_FW_P50, "fw_p50", "f(w) median"))
"""Staleness of the replayed trajectories (docs/monitors.md): metric, row field, column header."""


class BudgetError(RuntimeError):
    """A child run's step did not hold B*K group slots, or generated other than slots - experiential."""


def arm_result(store: ExperienceStore, run_id: str, arm: str, seed: int, slots: int,
               paper_id_avg: float | None, eval_dir: Path | None = None,
               target_weights: dict[int, float] | None = None) -> dict:
    """The table row and per-step curves of one child run, from its stored metrics, groups and evaluations.

    Budget per step: the groups hold B*K slots; experiential groups take one slot for a replayed
    trajectory, so generated = slots - experiential groups. A replay slot stays empty (`unfilled`) when
    its question retires in that very step: its trajectories leave the pool before selection (the iteration order of exgrpo_core/loop.py).
    Also: bucket counts per step, replays per source bucket (with the arm's target weights), the area
    under the held-out curve, and per-question results of the first and last evaluation (`eval_dir`:
    the run's eval/ folder of samples.jsonl files).
    """
    run = store.get_run(run_id) or {}
    K = run.get("group_size") or 0
    reward = (run.get("config") or {}).get("reward", {})
    continuous = reward.get("kind", "auto") == "continuous" or (reward.get("kind", "auto") == "auto"
                                                                and bool(reward.get("fn") or reward.get("url")))
    buckets = [M.bucket_key(k) for k in range(K + 1)]
    m = store.get_metrics(run_id, list(CURVE_KEYS) + buckets + [k for k, _, _ in STALENESS])
    steps = [s for s, _ in m.get(M.REWARD_MEAN, [])]
    curve = {k: [v for _, v in m.get(k, [])] for k in CURVE_KEYS}
    generated = curve[M.RESPONSES]
    replayed = curve[M.REPLAYED_SAMPLES] or [0.0] * len(generated)
    groups = store.group_slots(run_id)
    trace = [(step, *groups.get(step, (0, 0)), g, r) for step, g, r in zip(steps, generated, replayed)]
    last = {k: (v[-1] if v else math.nan) for k, v in curve.items()}
    row = {"arm": arm, "seed": seed, "run_id": run_id, "steps": len(steps), "continuous": continuous,
           "final_reward": last[M.REWARD_MEAN], "mean_reward": _mean(curve[M.REWARD_MEAN]),
           "final_fresh_pass1": last[M.FRESH_PASS1],
           "responses_generated": sum(generated), "responses_per_step_min": min(generated, default=math.nan),
           "responses_per_step_max": max(generated, default=math.nan), "replayed": sum(replayed),
           "unfilled": sum(t[2] for t in trace) - sum(replayed), "experiential": sum(t[2] for t in trace),
           "slots_per_step": slots, "slots_ok": bool(trace) and not _bad_steps(trace, slots),
           "buffer_questions": last[M.BUFFER_QUESTIONS], "buffer_trajectories": last[M.BUFFER_TRAJECTORIES],
           "retired": last[M.RETIRED_QUESTIONS], "heldout": heldout(store, run_id), "paper_id_avg": paper_id_avg}
    row["heldout_avg"] = row["heldout"].pop("average", math.nan)
    row.update(staleness(m))
    curves = {"step": steps, **{k: curve[k] for k in CURVE_KEYS},
              "responses_cumulative": _cumsum(generated),
              "buckets": {str(k): [v for _, v in m.get(M.bucket_key(k), [])] for k in range(K + 1)}}
    at_step = {-1: 0.0, **dict(zip(steps, curves["responses_cumulative"]))}  # step -1: the starting policy
    held = heldout_curve(store, run_id)  # evaluated after the step's update: responses through that step
    curves.update(heldout_step=[s for s, _ in held], heldout_pass1=[v for _, v in held],
                  heldout_responses=[at_step.get(s, math.nan) for s, _ in held])
    row["heldout_start"] = held[0][1] if held and held[0][0] == -1 else math.nan
    row["heldout_auc"] = stats.area_under_curve([s + 1 for s, _ in held], [v for _, v in held])
    row["replay_buckets"] = store.replay_buckets(run_id)
    row["bucket_occupancy"] = bucket_occupancy(curves["buckets"])
    row["target_weights"] = dict(target_weights or {})
    return {"row": row, "curves": curves, "slot_trace": trace, "questions": eval_questions(eval_dir)}


def bucket_occupancy(buckets: dict[str, list[float]]) -> dict[int, float]:
    """{k: mean over steps of the questions whose latest group had k correct} from the per-step
    `buffer/bucket_k` curves: how full each bucket was when the questions were drawn."""
    return {int(k): sum(v) / len(v) for k, v in buckets.items() if v}


def staleness(m: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """Over the steps that replayed: mean age weighted by replayed trajectories, the largest age and w,
    and the mean of the per-step w / f(w) quantiles; NaN for a run that never replayed."""
    n = {s: v for s, v in m.get(M.REPLAYED_SAMPLES, []) if v and v > 0}
    per = {field: [(n[s], v) for s, v in m.get(key, []) if s in n and v is not None] for key, field, _ in STALENESS}
    out = {field: _mean([v for _, v in per[field]]) for _, field, _ in STALENESS}
    out["age_mean"] = (sum(w * v for w, v in per["age_mean"]) / sum(w for w, _ in per["age_mean"])
                       if per["age_mean"] else math.nan)
    for field in ("age_max", "w_max"):
        out[field] = max((v for _, v in per[field]), default=math.nan)
    return out


def staleness_markdown(rows: list[dict], label: str = "arm") -> list[str]:
    """The staleness section of the report: one line per run (and arm mean) that replayed; `label` heads the
    rows' column."""
    shown = [r for r in rows if not math.isnan(r.get("age_mean", math.nan))]
    if not shown:
        return []
    head = [label, "seed", *(h for _, _, h in STALENESS)]
    return ["", "## Staleness of replayed trajectories", "",
            "Age = replaying step - sampling step; w = pi_theta / pi_behaviour per replayed token at the step's "
            "start, f(w) the weight the replay term applies; per-step quantiles averaged over the steps that "
            "replayed, max over the run.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join([md_escape(r["arm"]), str(r["seed"]), *(_fmt(r[f], f) for _, f, _ in STALENESS)]) + " |"
              for r in shown)]


def eval_questions(eval_dir: Path | None) -> dict:
    """Per-question results of a run's first and last stored evaluation: {"first"/"last": {"step": s,
    "correct": {uid: c}, "n": {uid: n}}}; {} without an eval folder. (Every step's would be large.)"""
    files = sorted(Path(eval_dir).glob("step_*/samples.jsonl")) if eval_dir and Path(eval_dir).is_dir() else []
    files = sorted(files, key=lambda f: int(f.parent.name.removeprefix("step_")))
    out = {}
    for label, f in (("first", files[0]), ("last", files[-1])) if files else ():
        lines = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out[label] = {"step": int(f.parent.name.removeprefix("step_")),
                      "correct": {q["uid"]: q["correct"] for q in lines}, "n": {q["uid"]: q["n"] for q in lines}}
    return out


def _bad_steps(trace: list[tuple], slots: int) -> list[tuple]:
    """Steps whose (step, group slots, experiential groups, generated, replayed) break the budget."""
    return [t for t in trace if t[1] != slots or t[3] != t[1] - t[2] or t[4] > t[2]]


def heldout(store: ExperienceStore, run_id: str) -> dict[str, float]:
    """pass@1 per benchmark (and `average`) of the run's latest evaluation; {} when never evaluated."""
    if not hasattr(store, "get_evals"):
        return {}
    evals = store.get_evals(run_id)
    if not evals:
        return {}
    last = max(e["step"] for e in evals)
    out = {e["benchmark"]: e["metrics"].get("pass@1", math.nan) for e in evals if e["step"] == last}
    if "average" not in out:
        out["average"] = _mean(list(out.values()))
    return out


def heldout_curve(store: ExperienceStore, run_id: str) -> list[tuple[int, float]]:
    """[(step, pass@1 averaged over benchmarks)] for every evaluation of the run, in step order."""
    by_step: dict[int, list[float]] = {}
    for e in store.get_evals(run_id) if hasattr(store, "get_evals") else []:
        by_step.setdefault(e["step"], []).append(e["metrics"].get("pass@1", math.nan))
    return [(step, _mean(v)) for step, v in sorted(by_step.items())]


def add_slots_to_target(results: list[dict], baseline: str = "on_policy") -> float:
    """Mark each row with the rollout slots it trained on until its held-out pass@1 first reached the
    baseline arm's final held-out pass@1 (mean over its seeds); NaN when it never did. Returns the target.

    Slots, not generated responses: every arm fills B*K slots a step, and a replay arm generates one response
    less per experiential question by construction, so counting generated responses would credit it with
    that saving whatever it learned. An evaluation after step s (index; -1 = the start) counts (s + 1) * B*K."""
    finals = [r["row"]["heldout_avg"] for r in results if r["row"]["arm"] == baseline]
    target = _mean(finals)
    for r in results:
        c, slots = r["curves"], r["row"].get("slots_per_step", math.nan)
        hits = [(s + 1) * slots for s, v in zip(c.get("heldout_step", []), c.get("heldout_pass1", []))
                if not math.isnan(target) and v >= target - 1e-12]
        r["row"]["heldout_target"] = target
        r["row"]["slots_to_target"] = hits[0] if hits else math.nan
        r["row"]["slots_trained"] = r["row"].get("steps", 0) * slots  # the censoring horizon
    return target


def check_budget(results: list[dict]) -> None:
    """Raise BudgetError naming every (arm, seed, step, slots, experiential, generated, replayed) off budget."""
    bad = [(r["row"]["arm"], r["row"]["seed"], *t) for r in results
           for t in _bad_steps(r["slot_trace"], r["row"]["slots_per_step"])]
    if bad:
        raise BudgetError(f"unequal rollout budget: every step must hold {results[0]['row']['slots_per_step']} "
                          "group slots with generated = slots - experiential groups; got (arm, seed, step, slots, "
                          f"experiential, generated, replayed) {bad[:10]}")


def mean_rows(rows: list[dict]) -> list[dict]:
    """One `mean` row per arm over its seeds (numbers averaged, held-out per benchmark too)."""
    out = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        group = [r for r in rows if r["arm"] == arm]
        mean = {"arm": arm, "seed": "mean", "run_id": "", "paper_id_avg": group[0]["paper_id_avg"],
                "slots_ok": all(r["slots_ok"] for r in group)}
        for k, v in group[0].items():
            if k not in mean and isinstance(v, (int, float)) and not isinstance(v, bool):
                mean[k] = _mean([r[k] for r in group])
        mean["heldout"] = {b: _mean([r["heldout"].get(b, math.nan) for r in group]) for b in group[0]["heldout"]}
        if "slots_to_target" in group[0]:  # a seed that never reached the target makes the mean "never"
            reach = [r["slots_to_target"] for r in group]
            mean["slots_to_target"] = math.nan if any(math.isnan(x) for x in reach) else _mean(reach)
        out.append(mean)
    return out


COLUMNS = [("arm", "arm"), ("seed", "seed"), ("final_reward", "final reward"), ("mean_reward", "mean reward"),
           ("final_fresh_pass1", "fresh pass@1"), ("heldout_avg", "held-out pass@1 avg"),
           ("heldout_start", "held-out at step 0"), ("heldout_auc", "held-out AUC"),
           ("responses_generated", "responses generated"),
           ("slots_to_target", "slots to on-policy final held-out"), ("responses_per_step_min", "responses/step min"),
           ("responses_per_step_max", "responses/step max"), ("replayed", "replayed"),
           ("unfilled", "unfilled replay slots"), ("experiential", "experiential questions"),
           ("slots_per_step", "slots/step (B·K)"), ("slots_ok", "budget ok"), ("buffer_questions", "buffer q"),
           ("buffer_trajectories", "buffer traj"), ("retired", "retired"), ("paper_id_avg", "paper ID avg (ref)")]


def table_rows(rows: list[dict], row_label: str = "arm",
               skip: tuple[str, ...] = ()) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of the full table (the CSV): COLUMNS (less `skip`) with one held-out column
    per benchmark before the average, and a `status` column after the seed when rows carry one (parallel
    children)."""
    cols = _columns(rows, row_label, skip)
    return [h for _, h in cols], [[_cell(r, k) for k, _ in cols] for r in rows]


MAX_COLUMNS = 10  # a Markdown table wider than this wraps on a laptop screen: the report splits it
MAIN_KEYS = ("arm", "seed", "status", "final_reward", "heldout_avg", "heldout_start", "heldout_auc",
             "responses_generated", "slots_to_target", "slots_ok")
DETAIL_TABLES = (("Rollout budget", ("responses_per_step_min", "responses_per_step_max", "replayed", "unfilled",
                                     "experiential", "slots_per_step", "slots_ok")),
                 ("Training reward and buffer", ("mean_reward", "final_fresh_pass1", "buffer_questions",
                                                 "buffer_trajectories", "retired", "paper_id_avg")))
"""The Markdown report's tables: MAIN_KEYS first, then per-benchmark held-out (two or more benchmarks,
MAX_COLUMNS - 2 a table) and these details, each led by the arm and seed columns; the CSV keeps every column."""


def markdown_tables(rows: list[dict], row_label: str = "arm", skip: tuple[str, ...] = ()) -> list[str]:
    """The table as Markdown tables of at most MAX_COLUMNS columns: the main one, then the details."""
    cols = dict(_columns(rows, row_label, skip))
    lead = [k for k in ("arm", "seed") if k in cols]
    benches = [k for k in cols if k.startswith("heldout:")]
    width = MAX_COLUMNS - len(lead)
    parts = [("", [k for k in MAIN_KEYS if k in cols])]
    if len(benches) > 1:
        parts += [(f"Held-out pass@1 per benchmark ({i // width + 1})" if len(benches) > width
                   else "Held-out pass@1 per benchmark", lead + benches[i:i + width])
                  for i in range(0, len(benches), width)]
    parts += [(title, lead + [k for k in keys if k in cols]) for title, keys in DETAIL_TABLES]
    out = []
    for title, keys in parts:
        if len(keys) <= len(lead):
            continue
        out += [*(["", f"### {title}"] if title else []), "", "| " + " | ".join(md_escape(cols[k]) for k in keys) + " |",
                "|" + "---|" * len(keys), *("| " + " | ".join(md_escape(_cell(r, k)) for k in keys) + " |" for r in rows)]
    return out[1:] if out and out[0] == "" else out


def _columns(rows: list[dict], row_label: str, skip: tuple[str, ...]) -> list[tuple[str, str]]:
    benches = sorted({b for r in rows for b in r["heldout"]})
    cols = [("arm", row_label), *COLUMNS[1:2], *([("status", "status")] if any("status" in r for r in rows) else []),
            *COLUMNS[2:5], *[(f"heldout:{b}", f"{b} pass@1") for b in benches], *COLUMNS[5:]]
    return [c for c in cols if c[0] not in skip]


def _cell(r: dict, key: str) -> str:
    return _fmt(r["heldout"].get(key[8:], math.nan) if key.startswith("heldout:") else r.get(key), key)


def write_report(results: list[dict], out_dir: Path, name: str, meta: dict,
                 prefix: str = "compare") -> dict[str, str]:
    """<prefix>_<name>.md/.csv/.json and four PNG plots in out_dir; returns {kind: path}. Rows whose
    `status` is not `finished` (a parallel child that failed or was cancelled) are listed, but left out
    of the means, statistics and plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [r["row"] for r in results]
    results = [r for r in results if r["row"].get("status", "finished") == "finished"]
    done = [r["row"] for r in results]
    add_slots_to_target(results)
    paired, buckets = compare_stats.paired_stats(done), compare_stats.replay_buckets(done)
    all_rows = rows + (mean_rows(done) if len({r["seed"] for r in done}) > 1 else [])
    header, cells = table_rows(all_rows, meta.get("row_label", "arm"), tuple(meta.get("skip_columns", ())))
    stem = out_dir / f"{prefix}_{name}"
    skip = tuple(meta.get("skip_columns", ()))
    notes = list(meta.get("notes", []))
    if any(r.get("continuous") for r in rows):
        notes.append("Continuous rewards (docs/rewards.md): *training reward* and *fresh pass@1* are mean rewards "
                     "in [0, 1], and the buckets are reward-spread buckets; held-out pass@1 is the benchmarks' own grading.")
    md = [f"# {meta.get('title', 'Comparison')} `{name}`", "", *notes, "",
          *markdown_tables(all_rows, meta.get("row_label", "arm"), skip)]
    collapsed = compare_stats.collapses(rows)
    md += compare_stats.markdown(paired, buckets, collapsed, meta.get("row_label", "arm"))
    if not paired and done and prefix == "compare":
        md += ["", compare_stats.unpaired_line(done)]
    md += staleness_markdown(all_rows, meta.get("row_label", "arm"))
    paths = {"md": f"{stem}.md", "csv": f"{stem}.csv", "json": f"{stem}.json"}
    Path(paths["md"]).write_text("\n".join(md) + "\n")
    with open(paths["csv"], "w", newline="") as f:
        csv.writer(f).writerows([header, *cells])
    paths.update(plot(results, out_dir, name, prefix))
    doc = {"name": name, **{k: v for k, v in meta.items() if k != "notes"}, "rows": all_rows,
           "curves": {f"{r['row']['arm']}/s{r['row']['seed']}": r["curves"] for r in results},
           "stats": {"paired_vs_on_policy": paired, "replay_buckets": buckets, "collapses": collapsed},
           "eval_questions": {f"{r['row']['arm']}/s{r['row']['seed']}": r.get("questions", {}) for r in results},
           "files": paths}
    Path(paths["json"]).write_text(json.dumps(_finite(doc), indent=1))
    return paths


def plot(results: list[dict], out_dir: Path, name: str, prefix: str = "compare") -> dict[str, str]:
    """Reward and held-out pass@1 vs responses generated, buffer and retired growth vs step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = {"reward": ("responses_cumulative", M.REWARD_MEAN, "responses generated", "training reward"),
             "heldout": ("heldout_responses", "heldout_pass1", "responses generated", "held-out pass@1"),
             "buffer": ("step", M.BUFFER_QUESTIONS, "step", "buffer questions"),
             "retired": ("step", M.RETIRED_QUESTIONS, "step", "retired questions")}
    arms = list(dict.fromkeys(r["row"]["arm"] for r in results))
    seeds = list(dict.fromkeys(r["row"]["seed"] for r in results))
    paths = {}
    for kind, (x, y, xlabel, ylabel) in specs.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in results:  # colour = arm, line style = seed
            c, arm, seed = r["curves"], r["row"]["arm"], r["row"]["seed"]
            xs = [M.step_number(s) for s in c.get(x, [])] if x == "step" else c.get(x, [])  # curves keep indices
            ax.plot(xs, c.get(y, []), label=f"{arm} s{seed}", linewidth=1.2,
                    color=plt.cm.tab10(arms.index(arm) % 10), linestyle=("-", "--", ":", "-.")[seeds.index(seed) % 4],
                    marker="o" if kind == "heldout" else None, markersize=3)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{name}: {ylabel}")
        if not any(len(r["curves"].get(y, [])) for r in results):  # say why the plot is empty
            ax.text(0.5, 0.5, f"no {ylabel} recorded" + (" (no held-out evaluation: eval.suites / eval.final)"
                                                          if kind == "heldout" else ""),
                    ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        paths[f"png_{kind}"] = str(out_dir / f"{prefix}_{name}_{kind}.png")
        fig.tight_layout()
        fig.savefig(paths[f"png_{kind}"], dpi=110)
        plt.close(fig)
    return paths


_COUNTS = {"responses_generated", "slots_to_target", "slots_trained", "experiential", "responses_per_step_min", "responses_per_step_max", "replayed", "unfilled",
           "slots_per_step", "buffer_questions", "buffer_trajectories", "retired", "age_max"}


def _fmt(v, key: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.1f}" if key == "paper_id_avg" or (key in _COUNTS and not v.is_integer()) else \
            f"{v:.0f}" if key in _COUNTS else f"{v:.3f}"
    return str(v)


def _mean(xs) -> float:
    xs = [x for x in xs if isinstance(x, (int, float)) and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _cumsum(xs: list[float]) -> list[float]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return out


def _finite(obj):
    """NaN -> None so the JSON is standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
