"""`exgrpo` command line: train through the Prefect flow with a progress display; manage the database.

    exgrpo train --config configs/tiny.yaml --set run.steps=5
    exgrpo config --config cpu-demo --set rollout.group_size=4     # print the resolved config
    exgrpo db upgrade [--url URL]
    exgrpo compare --config tiny --arms on_policy,exgrpo --seeds 0,1   # child runs + comparison table
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

console = Console(highlight=False)


def _progress_line(step: int, total: int, m: dict) -> None:
    console.print(
        f"step {step + 1:>4}/{total} | reward {m.get('rollout/reward_mean', 0):.3f} "
        f"| fresh pass@1 {m.get('rollout/fresh_pass1', 0):.3f} "
        f"| buffer {int(m.get('buffer/questions', 0))} q / {int(m.get('buffer/trajectories', 0))} traj "
        f"| retired {int(m.get('buffer/retired_questions', 0))} "
        f"| replay {'on ' if m.get('buffer/replay_active') else 'off'} ({int(m.get('select/replayed_samples', 0))}) "
        f"| loss {m.get('loss/total', 0):+.4f} | {m.get('perf/iteration_s', 0):.1f} s")


def cmd_train(args: argparse.Namespace) -> int:
    from exgrpo_core.config_io import load_config

    cfg = load_config(args.config, args.set)  # fail on a bad config before Prefect starts
    console.print(f"[bold]ExGRPO[/bold] preset={cfg.preset} model={cfg.model.name_or_path} "
                  f"steps={cfg.run.steps} run_dir={os.path.join(cfg.run.output_dir, cfg.run.name)}")
    if not os.environ.get("PREFECT_API_URL"):
        console.print("starting Prefect's ephemeral API (set PREFECT_API_URL to use a server)...")
    from flows import train as train_flow

    train_flow.PROGRESS.append(_progress_line)
    summary = train_flow.train(preset=cfg.preset, config=cfg)
    console.print(f"[green]done[/green]: run {summary['run_id']} ({summary['steps']} steps), "
                  f"MLflow run {summary['mlflow_run_id']}, run dir {summary['run_dir']}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from exgrpo_core.config_io import load_config

    cfg = load_config(args.config, args.set)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from exgrpo_core.store import ExperienceStore, resolve_db_url

    url = resolve_db_url(args.url, os.path.abspath(args.run_dir))
    store = ExperienceStore(url)
    head = store.upgrade()
    store.close()
    console.print(f"database at revision {head}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from flows.compare_arms import build_arm_runs, parse_arms, parse_seeds

    arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
    runs = build_arm_runs(args.config, args.set, arms, seeds, args.name or f"compare-{args.config}",
                          not args.no_eval)  # unknown arm or bad override: exit 2 before Prefect starts
    console.print(f"[bold]ExGRPO comparison[/bold]: {len(runs)} runs, arms {','.join(arms)}, seeds {seeds}")
    from flows.compare import compare

    out = compare(preset=args.config, overrides=args.set, arms=arms, seeds=seeds, evaluate=not args.no_eval,
                  name=args.name)
    console.print(f"[green]done[/green]: table {out['files']['md']}, MLflow parent run {out['parent_mlflow_run_id']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exgrpo", description="ExGRPO training platform")
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("train", cmd_train, "run the Prefect training flow"),
                            ("config", cmd_config, "print the resolved config")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", required=True, help="preset name (tiny, cpu-demo, paper) or YAML path")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set rollout.group_size=4 (repeatable)")
        sp.set_defaults(fn=fn)
    db = sub.add_parser("db", help="experience database")
    db.add_argument("action", choices=["upgrade"])
    db.add_argument("--url", default=None, help="SQLAlchemy URL (default: EXGRPO_DB_URL, else SQLite in --run-dir)")
    db.add_argument("--run-dir", default="runs/exgrpo", help="where the default SQLite file lives")
    db.set_defaults(fn=cmd_db)
    cp = sub.add_parser("compare", help="on-policy GRPO vs ExGRPO and ablations as child runs (Prefect flow)")
    cp.add_argument("--config", required=True, help="preset name (tiny, cpu-demo, paper) or YAML path")
    cp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every arm")
    cp.add_argument("--arms", default=None, help="comma-separated arms (default: all; see docs/comparison.md)")
    cp.add_argument("--seeds", default="0", help="comma-separated seeds, one child run per arm and seed")
    cp.add_argument("--name", default=None, help="comparison name (default compare-<config>); rerun to resume")
    cp.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation of each arm")
    cp.set_defaults(fn=cmd_compare)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no phoning home from the API
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: rerun the same command to resume from the last checkpoint")
        return 130
    except Exception as e:  # noqa: BLE001 - known user errors get one clear line, others a traceback
        if type(e).__name__ in _USER_ERRORS:
            console.print(f"[red]error[/red]: {e}")
            return 2
        raise


_USER_ERRORS = {"ConfigError", "DataError", "StoreError", "TrackingError", "ModelLoadError", "ResumeError",
                "VLLMUnavailable", "BudgetError"}

if __name__ == "__main__":
    sys.exit(main())
