"""Evaluation tables like the paper's Table 1: rows = runs, columns = benchmarks + averages, pass@1 in %.

Columns: the in-distribution benchmarks, "ID Avg", the out-of-distribution ones, "OOD Avg" (each group
only when one of its benchmarks is there; which group a benchmark is in is declared in
`suites.BENCHMARKS`), benchmarks in no group, and "Avg." over all benchmarks.

Input is what `EvalReport.summary()` returns (or the train flow's `eval` key), one per run label.
Written as Markdown, CSV, JSON and a PNG bar plot (matplotlib, Agg backend); also a per-question
samples file. Knows nothing of MLflow: the flows log the files this module writes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from exgrpo_core.evaluation.evaluate import AVERAGE, EvalReport, group_averages
from exgrpo_core.evaluation.suites import BENCHMARKS, GROUPS, ID, OOD, group_of

PAPER_ORDER = tuple(dict.fromkeys(b.name for b in BENCHMARKS.values()))
AVG_COLUMN = "Avg."
GROUP_COLUMNS = {ID: "ID Avg", OOD: "OOD Avg"}


def benchmark_columns(summaries: dict[str, dict]) -> list[str]:
    """The paper's benchmarks first in its order, then the others in order of appearance."""
    seen: list[str] = []
    for s in summaries.values():
        seen += [b for b in s if b != AVERAGE and b not in seen]
    known = [b for b in PAPER_ORDER if b in seen]
    return known + [b for b in seen if b not in known]


def table_layout(summaries: dict[str, dict]) -> list[tuple[str, str]]:
    """Columns as (kind, key): ("benchmark", name), ("group", ID / OOD) after its benchmarks, ("all", AVERAGE)."""
    cols = benchmark_columns(summaries)
    layout: list[tuple[str, str]] = []
    for group in GROUPS:
        members = [b for b in cols if group_of(b) == group]
        if members:
            layout += [("benchmark", b) for b in members] + [("group", group)]
    return layout + [("benchmark", b) for b in cols if group_of(b) is None] + [("all", AVERAGE)]


def results_table(summaries: dict[str, dict], metric: str = "pass@1") -> tuple[list[str], list[list]]:
    """(header, rows) with `metric` in percent (None where a run lacks a benchmark); header names avg@k.

    A group column is the unweighted mean of the run's benchmarks in that group.
    Example: {"ExGRPO": {"AIME24": {"pass@1": 0.2, "samples": 32}, "ARC-c": {"pass@1": 0.8},
    "average": {"pass@1": 0.5}}} -> (["run", "AIME24 (avg@32)", "ID Avg", "ARC-c", "OOD Avg", "Avg."],
    [["ExGRPO", 20.0, 20.0, 80.0, 80.0, 50.0]]).
    """
    layout = table_layout(summaries)
    header = ["run"]
    for kind, key in layout:
        if kind == "benchmark":
            ks = {int(s[key].get("samples", 1)) for s in summaries.values() if key in s}
            header.append(f"{key} (avg@{ks.pop()})" if len(ks) == 1 and max(ks) > 1 else key)
        else:
            header.append(GROUP_COLUMNS[key] if kind == "group" else AVG_COLUMN)
    rows = []
    for label, s in summaries.items():
        groups = group_averages({b: m[metric] for b, m in s.items() if b != AVERAGE and metric in m})
        row: list = [label]
        for kind, key in layout:
            v = groups.get(key) if kind == "group" else s.get(key, {}).get(metric)
            row.append(None if v is None else round(100 * float(v), 1))
        rows.append(row)
    return header, rows


def to_markdown(header: list[str], rows: list[list]) -> str:
    cells = [[("-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)) for v in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells]) + "\n"


def plot_table(header: list[str], rows: list[list], path: Path, title: str = "pass@1 (%)") -> Path:
    """Grouped bars: one group per benchmark (and Avg.), one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = header[1:]
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cols) + 2), 4))
    for i, row in enumerate(rows):
        xs = [j + i * width for j in range(len(cols))]
        ax.bar(xs, [0.0 if v is None else v for v in row[1:]], width, label=str(row[0]))
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(cols))], cols, rotation=20, ha="right")
    ax.set_ylabel("%")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_table(summaries: dict[str, dict], out_dir: str | Path, stem: str = "eval_table") -> dict[str, Path]:
    """Write `<stem>.md/.csv/.json/.png` into out_dir; returns {format: path}. JSON keeps every metric."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = results_table(summaries)
    paths = {"md": out / f"{stem}.md", "csv": out / f"{stem}.csv", "json": out / f"{stem}.json",
             "png": out / f"{stem}.png"}
    paths["md"].write_text(to_markdown(header, rows), encoding="utf-8")
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header] + rows)
    paths["json"].write_text(json.dumps(summaries, indent=2, sort_keys=False), encoding="utf-8")
    plot_table(header, rows, paths["png"])
    return paths


def write_samples(report: EvalReport, path: str | Path) -> Path:
    """One JSON line per question: benchmark, uid, answer, n, correct, grading reasons, first response."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in report.questions:
            f.write(json.dumps({"benchmark": r.benchmark, "uid": r.uid, "answer": r.answer, "n": r.n,
                                "correct": r.correct, "reasons": r.reasons, "example": r.example},
                               ensure_ascii=False) + "\n")
    return path


