"""`exgrpo replay-what-if`: what another selection policy would have replayed from a finished run's pool
(exgrpo_core.store.what_if.py), beside what the run replayed; with --rescore, both sides' trajectories scored
under a checkpoint (exgrpo_core/run/rescore.py). Reads only."""

from __future__ import annotations

import argparse
import copy
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
    wi.add_argument("--rescore", default=None, metavar="CHECKPOINT",
                    help="also score both sides' trajectories under this policy: a checkpoint folder (or step_N "
                    "of the run), a model folder or a model name (tiny, a hub name)")
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
        row = store.get_run(run_id)
        name = row["name"]
        rescore = getattr(args, "rescore", None)
        if rescore is not None:  # its one-line errors before the what-if and the model load
            import torch

            from exgrpo_core.config.load import build_config
            from exgrpo_core.run import rescore as R

            run_cfg = build_config(copy.deepcopy(row["config"]), source=f"run {name}'s stored config")
            source = R.resolve(rescore, Path(cfg.run.output_dir) / name)
            info = R.check_source(source, run_cfg)
        out = what_if(store, run_id, cfg, seed=args.seed)
        if rescore is not None:
            model, tokenizer = R.load(source, run_cfg)
            if torch.cuda.is_available():  # else the CPU, in micro batches
                model = model.cuda()
            out["rescore"] = R.rescore(store, run_id, out, run_cfg, cfg, model, tokenizer, info, progress=(
                lambda done, total: console.print(f"rescoring under {source}: {done}/{total} trajectories")))
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
    if "rescore" in out:
        console.print(rescore_table(out["rescore"]))
    dest = Path(args.out or os.path.join(cfg.run.output_dir, name, "what_if.json"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=str) + "\n")
    console.print(f"report: {dest}")
    return 0


def rescore_table(rs: dict) -> Table:
    """Both sides' replayed trajectories under the checkpoint (means; the loss weight per token)."""
    table = Table(title=f"under {rs['checkpoint']}" + ("" if rs["step"] is None else f" (step {rs['step']})"))
    for col in ("", "policy (what if)", "the run"):
        table.add_column(col)
    wi, ac = rs["summary"]["what_if"], rs["summary"]["actual"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    weight = "f(w) per token" if rs["shaping_beta"] is not None else "w per token"
    for label, key, f in (("trajectories", "trajectories", "d"), ("log-ratio, sequence", "seq_log_ratio", ".4f"),
                          ("log-ratio, token mean", "token_log_ratio", ".4f"), (weight, "weight", ".4f"),
                          ("entropy (checkpoint)", "entropy", ".4g"), ("entropy (stored)", "stored_entropy", ".4g"),
                          ("lowest-entropy choice changed", "lowest_changed", ".0%")):
        table.add_row(label, fmt(wi[key], f), fmt(ac[key], f))
    return table
