"""The comparison report says what its numbers count: slots to the target on the same budget in every arm,
verdicts that agree with the interval shown, one count of experiential questions in the budget and bucket
tables, no empty Holm family, Markdown that renders as written, where parallel children came from, and
grid points headed as grid points (flows/compare/report.py, stats.py, parallel.py)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from markdown_it import MarkdownIt
from test_compare import _child

from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.store.experience_store import ExperienceStore
from flows.compare import flow, parallel as par, report, stats as compare_stats
from flows.compare.arms import build_arm_runs

NAN = math.nan


def _tables(md: str) -> list[list[list[str]]]:
    """Every Markdown table as rows of cells (header first)."""
    out, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                cur.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif cur:
            out, cur = out + [cur], []
    return out


def _evaluated(store, plan, points):
    run = _child(store, plan, [0.1] * len(plan))
    for step, v in points:
        store.save_eval(run, step, "arith", {"pass@1": v}, 4)
    return run


def test_slots_to_target_charge_every_arm_the_same_budget_per_step(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    plan_on, plan_ex = [(8, 0, 0)] * 4, [(8, 0, 0)] + [(4, 4, 4)] * 3  # exgrpo generates 4 fewer a step
    on = _evaluated(store, plan_on, [(1, 0.2), (3, 0.5)])
    ex = _evaluated(store, plan_ex, [(1, 0.3), (3, 0.5)])  # both reach on_policy's 0.5 after step 3
    results = [report.arm_result(store, on, "on_policy", 0, 64, None), report.arm_result(store, ex, "exgrpo", 0, 64, None)]
    assert [r["row"]["responses_generated"] for r in results] == [256, 244]
    md = Path(report.write_report(results, tmp_path / "out", "t", {})["md"]).read_text()
    assert [r["row"]["slots_to_target"] for r in results] == [256, 256]  # the same step: the same cost
    main = _tables(md)[0]
    assert main[0][7] == "slots to on-policy final held-out" and [r[7] for r in main[1:]] == ["256", "256"]
    assert "responses to" not in md
    store.close()


def _row(arm, seed, reach, trained=640):
    return {"arm": arm, "seed": seed, "heldout_avg": 0.5, "heldout_start": NAN, "heldout_auc": NAN,
            "slots_to_target": reach, "slots_trained": trained, "replay_buckets": {}, "target_weights": {}}


def test_a_censored_null_whose_t_interval_excludes_zero_is_a_hint_as_the_legend_says():
    on = [320, 384, 256, 512, 448]
    ex = [256, 256, 160, NAN, NAN]  # 3 seeds both reached (exgrpo earlier), 2 only on_policy reached
    rows = [_row("on_policy", s, v) for s, v in enumerate(on)] + [_row("exgrpo", s, v) for s, v in enumerate(ex)]
    s = compare_stats.paired_stats(rows)["exgrpo"]["slots_to_target"]
    assert s["n"] == 3 and s["t_hi"] < 0  # the interval shown excludes 0 on the arm's side
    assert s["censored"]["p"] >= 0.05  # 3 pairs earlier, 2 later: the censored test does not tell
    assert s["final_verdict"].startswith("hint: ahead (t-interval over the 3 seeds both reached excludes 0")
    md = "\n".join(compare_stats.markdown(compare_stats.paired_stats(rows), {}))
    row = next(r for r in _tables(md)[0] if r[1].startswith("rollout slots"))
    assert ".. -" in row[4] and row[6].startswith("hint: ahead"), row  # interval below 0, verdict a hint


def test_bucket_and_budget_tables_count_the_same_experiential_questions(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    ex = _child(store, [(8, 0, 0), (4, 4, 4), (5, 3, 2)], [0.1, 0.3, 0.5])  # 7 drawn: 6 replayed, 1 unfilled
    results = [report.arm_result(store, ex, "exgrpo", 0, 64, None, target_weights={4: 1.0})]
    md = Path(report.write_report(results, tmp_path / "out", "b", {})["md"]).read_text()
    budget = next(t for t in _tables(md) if "unfilled replay slots" in t[0])
    cells = dict(zip(budget[0], budget[1]))
    assert (cells["replayed"], cells["unfilled replay slots"], cells["experiential questions"]) == ("6", "1", "7")
    buckets = md.split("## Replays by source bucket", 1)[1]
    table = _tables(buckets)[0]
    assert table[0][-1] == "drawn" and table[1][-1] == "7"
    assert sum(int(c.split()[0]) for c in table[1][1:-1] if c != "—") == 7
    assert "`experiential questions`" in buckets  # the section says which column it matches
    store.close()


def test_no_holm_family_is_not_called_a_family_of_zero():
    rows = [_row("on_policy", s, 64) for s in range(2)] + [_row("exgrpo", s, 64) for s in range(2)]  # all tie
    paired = compare_stats.paired_stats(rows)
    assert compare_stats._family(paired) == 0
    md = "\n".join(compare_stats.markdown(paired, {}))
    assert "over the 0" not in md and "nothing is corrected" in md
    one = compare_stats.paired_legend(1)[0]
    assert "over the 1 final and area comparison of" in one


def test_the_report_renders_without_stray_emphasis(tmp_path):
    base = load_config("tiny", ["eval.suites=[bundled:tiny_arith_*]"])  # a name with Markdown in it
    runs = build_arm_runs("tiny", None, "on_policy,exgrpo", [0], "m", evaluate=True)
    meta = flow._meta(base, "tiny", [], "on_policy,exgrpo", [0], "m", True, runs)
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    results = [report.arm_result(store, _child(store, [(8, 0, 0)], [0.1]), arm, 0, 64, None)
               for arm in ("on_policy", "x*y*z")]
    md = Path(report.write_report(results, tmp_path / "out", "m", meta)["md"]).read_text()
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<em>" not in html and "<strong>" not in html
    assert "B·K=64" in html and "x*y*z" in html and "tiny_arith_*" in html  # shown as written
    store.close()


def test_the_parallel_note_says_the_children_were_read_back_from_a_sequential_run(monkeypatch):
    runs = build_arm_runs("tiny", None, "on_policy,exgrpo", [0], "p", evaluate=False)
    children = [par.Child(r.arm, r.seed, r.cfg, r.overrides) for r in runs]
    client = SimpleNamespace(read_deployment_by_name=lambda name: SimpleNamespace(work_pool_name="pool"))

    @contextmanager
    def get_client(sync_client):
        yield client

    monkeypatch.setattr("prefect.get_client", get_client)
    monkeypatch.setattr(par, "finished_summary", lambda cfg: {"run_id": "r"})  # finished in the database
    monkeypatch.setattr(par, "find_children", lambda client, parent: {})  # no flow run ever submitted
    monkeypatch.setattr(par, "collect", lambda child, state: par.placeholder(child, state))
    monkeypatch.setattr(par, "submit", lambda *a, **k: (_ for _ in ()).throw(AssertionError("submitted")))
    results = par.run_children(children, par.Target(), "p", "tiny", None)
    text = par.note(results, par.Target())
    assert "2 of 2 children were read back from the experience database" in text and "sequential" in text
    assert "ran as flow runs" not in text
    results[0]["row"]["origin"] = "flow run"
    assert "1 of 2 children ran as flow runs of the deployment `exgrpo-train/exgrpo-train`" in par.note(
        results, par.Target())


def test_sweep_sections_head_grid_points_as_grid_points(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    results = []
    for label in ("train.lr=0.1", "train.lr=0.2"):
        run = _evaluated(store, [(8, 0, 0), (4, 4, 4), (5, 3, 2)], [(-1, 0.6), (2, 0.1)])  # collapsed
        store.log_metrics(run, 1, {M.REPLAY_AGE_MEAN: 1.0, M.REPLAY_AGE_MAX: 1, M.REPLAY_W_P50: 1.0,
                                   M.REPLAY_W_P90: 1.0, M.REPLAY_W_MAX: 1.0, M.REPLAY_FW_P50: 0.9})
        results.append(report.arm_result(store, run, label, 0, 64, None, target_weights={4: 1.0}))
    meta = {"title": "Sweep", "row_label": "grid point", "skip_columns": ["slots_to_target", "paper_id_avg"]}
    md = Path(report.write_report(results, tmp_path / "out", "s", meta, prefix="sweep")["md"]).read_text()
    tables = _tables(md)
    assert {"## Collapsed runs", "## Replays by source bucket", "## Staleness of replayed trajectories"} <= set(
        md.splitlines())
    assert len(tables) >= 6 and all(t[0][0] == "grid point" for t in tables), [t[0][0] for t in tables]
    store.close()
