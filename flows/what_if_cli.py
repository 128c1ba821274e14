"""`exgrpo replay-what-if`: what another selection policy would have replayed from a finished run's pool
(exgrpo_core.store.what_if.py), beside what the run replayed. Reads only."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)


def add_parser(sub, config_args) -> None:
    wi = sub.add_parser("replay-what-if", help="re-run a selection policy on a finished run's stored pool, "
                        "without training, beside what the run replayed")
    config_args(wi, required=True, config_help="preset or YAML: the policy (selection.*, buffer.replay_ratio) and "
                "the database", set_help="a change of the policy, e.g. --set selection.mu=0.25 (repeatable)")
    wi.add_argument("--run", required=True, help="run name or id")
    wi.add_argument("--db-url", default=None, help="experience database URL (default: as training resolves it)")
    wi.add_argument("--seed", type=int, default=0, help="the counterfactual draws' seed")
    wi.add_argument("--out", default=None, help="JSON report path (default: RUN_DIR/what_if.json)")
    wi.set_defaults(fn=cmd_what_if)


def cmd_what_if(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url

    from exgrpo_core.config.load import load_config
    from exgrpo_core.store.what_if import what_if
    from exgrpo_core.reward.reverify import find_run
    from exgrpo_core.store.engine import StoreError
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    cfg = load_config(args.config, args.set)
    db_url = resolve_db_url(args.db_url or cfg.run.db_url, os.path.join(cfg.run.output_dir, args.run))
    if db_url.startswith("sqlite") and not Path(make_url(db_url).database or "").is_file():
        raise StoreError(f"no run {args.run!r}: no experience database at {make_url(db_url).database} "
                         "(name the database with --db-url or --config)")
    with ExperienceStore(db_url) as store:
        run_id = find_run(store, args.run)
        name = store.get_run(run_id)["name"]
        out = what_if(store, run_id, cfg, seed=args.seed)
    wi, ac = out["what_if"], out["actual"]
    first, last = (out["steps"] + [None, None])[:2]
    table = Table(title=f"run {name}: replays of steps {first}-{last}, the policy's vs the run's")
    for col in ("", "policy (what if)", "the run", "target"):
        table.add_column(col)
    for k in sorted(set(wi["share"]) | set(ac["share"]) | set(wi["target"])):
        table.add_row(f"share from k = {k}", f"{100 * wi['share'].get(k, 0):.0f}%", f"{100 * ac['share'].get(k, 0):.0f}%",
                      f"{100 * wi['target'].get(k, 0):.0f}%")
    table.add_row("replays", str(wi["replays"]), str(ac["replays"]), "")
    table.add_row("distinct questions", str(wi["distinct_questions"]), str(ac["distinct_questions"]), "")
    table.add_row("mean age (steps)", f"{wi['age_mean']:.1f}", f"{ac['age_mean']:.1f}", "")
    table.add_row("mean entropy", f"{wi['entropy_mean']:.4f} (stored)", f"{ac['entropy_mean']:.4f} (at replay)", "")
    console.print(table)
    dest = Path(args.out or os.path.join(cfg.run.output_dir, name, "what_if.json"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=str) + "\n")
    console.print(f"report: {dest}")
    return 0
