"""`exgrpo` command line: train through the Prefect flow with a progress display; manage the database.

    exgrpo train --config configs/tiny.yaml --set run.steps=5
    torchrun --nproc_per_node 2 -m flows.cli train --config tiny   # two processes (docs/scaling.md)
    exgrpo config --config cpu-demo --set rollout.group_size=4     # print the resolved config
    exgrpo db upgrade [--url URL]
    exgrpo dashboard --config cpu-demo [--port 8501]              # Streamlit dashboard, read-only
    exgrpo compare --config tiny --arms on_policy,exgrpo --seeds 0,1   # child runs + comparison table
    exgrpo compare --config tiny --seeds 0-3 --parallel --slots 4       # children on a work pool (docs/scaling.md)
    exgrpo sweep --config tiny --grid train.lr=1e-6,3e-6 --seeds 0-3    # a grid as parallel children
    exgrpo evaluate --config cpu-demo --run cpu-demo --suite gsm8k   # a run's latest checkpoint
    exgrpo evaluate --config paper --model Qwen/Qwen2.5-Math-7B --suite paper --suite ood   # Table 1
    exgrpo reverify --config tiny --run tiny [--apply]             # regrade stored rewards (verifier audit)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flows import cli_tools, what_if_cli

console = Console(highlight=False, soft_wrap=True)  # lines are never wrapped: a narrow terminal wraps them itself


def _progress_line(step: int, total: int, m: dict) -> None:
    from flows.run_report import step_line

    console.print(step_line(step, total, m), markup=False)


def cmd_train(args: argparse.Namespace) -> int:
    from exgrpo_core.config.load import load_config

    started = time.perf_counter()
    cfg = load_config(args.config, args.set)  # fail on a bad config before Prefect starts
    if int(os.environ.get("RANK", "0")) > 0:  # a follower under torchrun / accelerate launch: no Prefect, no DB
        from exgrpo_core.run.session import run_follower

        run_follower(cfg)
        return 0
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    try:
        _preflight(cfg, run_dir, args.set, args.config)  # user errors before Prefect starts
        console.print("[bold]ExGRPO[/bold] " + escape(f"preset={cfg.preset} model={cfg.model.name_or_path} "
                      f"steps={cfg.run.steps} run_dir={os.path.join(cfg.run.output_dir, cfg.run.name)}"))
        if not os.environ.get("PREFECT_API_URL"):
            console.print("starting Prefect's ephemeral API (set PREFECT_API_URL to use a server)...")
        from flows.prefect_api import serve_prefect_api
        ephemeral = serve_prefect_api() is not None  # before Prefect is imported; dies with this process
        from exgrpo_core.config.redact import hide
        from flows import train as train_flow

        train_flow.PROGRESS.append(_progress_line)
        summary = train_flow.train(preset=cfg.preset, config=hide(cfg))  # Prefect records no password
    except BaseException:
        from exgrpo_core.run.locks import remove_failed_start

        remove_failed_start(run_dir)  # a failed start leaves no empty run directory it created (and no other)
        raise
    from flows.run_report import summary_lines

    done, *rest = summary_lines(summary, prefect=not ephemeral,  # the ephemeral API has no UI
                                command_s=time.perf_counter() - started)
    console.print("[green]done[/green]: " + escape(done.removeprefix("done: ")))
    for line in rest:
        console.print(line, markup=False)
    return 0


def _preflight(cfg, run_dir: Path, sets: list[str] | None = None, config: str | None = None) -> None:
    """Find user errors in seconds, before Prefect's server and the flow start: the dataset, the database
    (a server must answer), the MLflow server, another process on the run, a damaged checkpoint."""
    from exgrpo_core.data import questions as data
    from exgrpo_core.run import checkpoint
    from exgrpo_core.run.locks import lock_run, make_run_dir
    from exgrpo_core.store.engine import create_store_engine, parse_url, resolve_db_url
    from flows.tracking import check_server

    from exgrpo_core.run.session import check_context, check_database, check_golds

    from flows import input_checks

    input_checks.check_before_run_dir(cfg)  # the model folder, run.output_dir, the engine, the MLflow store
    check_context(cfg)  # prompt + response must fit the model's positions (read from its config)
    questions = data.load_questions(
        cfg.data.train_path, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
        system_prompt=cfg.data.system_prompt, instruction=cfg.data.instruction, max_questions=cfg.data.max_questions,
        prompt_template=cfg.data.prompt_template)
    check_golds(cfg, questions)  # no usable gold answer at all: one line now, not after Prefect starts
    make_run_dir(run_dir)  # the default SQLite database lives in it (removed if the start fails)
    db_url = resolve_db_url(cfg.run.db_url, run_dir)
    url = parse_url(db_url)
    if url.get_backend_name() != "sqlite":
        create_store_engine(url).dispose()  # connects once: an unreachable server is one line
    input_checks.check_schema(db_url)  # another application's database or a schema revision we do not know
    if cfg.buffer.warm_start and cfg.run.resume != "must" and checkpoint.latest_checkpoint(run_dir) is None:
        from exgrpo_core.run.reuse import plan_warm_start

        plan = plan_warm_start(cfg, questions, db_url)  # an unknown or unfitting source run is one line
        console.print(f"warm start from {', '.join(cfg.buffer.warm_start)}: "
                      f"{sum(len(e['trajectories']) for e in plan['exports'])} pooled trajectories of "
                      f"{len({d for e in plan['exports'] for d in e['buckets']})} questions")
    uri = cfg.run.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_server(uri)  # a server must answer; the default local store is created by the flow
    lock_run(run_dir, cfg.run.name, db_url)  # a second process on this run is refused here
    if cfg.run.resume != "never":  # a damaged checkpoint: set aside with a warning, or one line; a lost
        ckpt = checkpoint.resume_point(run_dir)  # database (the run missing or behind it): one line
        check_database(ckpt, db_url)
        input_checks.check_resume(cfg, ckpt, questions, db_url)  # the same dataset and group size
    from flows.train_params import AlreadyFinishedError, asks_for_steps, finished_run

    if done := finished_run(cfg, extend=asks_for_steps(sets, config)):  # a finished run trains only when
        raise AlreadyFinishedError(done["message"])  # more steps are asked for: else one line, exit 0


def cmd_config(args: argparse.Namespace) -> int:
    """The resolved config as plain YAML (no rich markup or wrapping: it must survive a pipe), or with
    --help-keys every key's type, default and help."""
    import yaml

    from exgrpo_core.config.load import ConfigError, load_config

    if args.help_keys is not None:
        from exgrpo_core.config.keys import format_keys

        return _write(format_keys(args.help_keys))
    if not args.config:
        raise ConfigError("exgrpo config needs --config PRESET_OR_YAML (or --help-keys [PREFIX] for the keys)")
    cfg = load_config(args.config, args.set)
    return _write(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True,
                                 width=1 << 30))  # one line per value


def _write(text: str) -> int:
    """Plain text to stdout; a reader that stops early (`| head`) ends it quietly."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import importlib.util

    from exgrpo_core.config.load import load_config
    from exgrpo_core.config.redact import reveal_url
    from exgrpo_core.config.schema import ExGRPOConfig
    from exgrpo_core.store.engine import mask_url, parse_url
    from flows.tracking import resolve_tracking_uri

    from flows import dashboard_gate as gate

    login = os.environ.get(gate.LOGIN_ENV)
    problem = gate.serving_problem(args.host, login)
    if problem:
        console.print("[red]error[/red]: " + escape(problem))
        return 2
    cfg = load_config(args.config, args.set) if args.config else ExGRPOConfig()
    db_url, source = dashboard_db_url(args.db_url, cfg)
    if not db_url.startswith("sqlite"):  # a bad server URL is one clear error; a missing SQLite file (or
        parse_url(db_url)                # folder) is explained on the page until training creates it
    mlflow_uri = reveal_url(args.mlflow_uri, "MLFLOW_TRACKING_URI") or resolve_tracking_uri(cfg)
    app = os.path.join(os.path.dirname(importlib.util.find_spec("dashboard").origin), "app.py")
    mlflow_env, reader = gate.mlflow_env(os.environ)
    console.print(f"dashboard on http://{args.host}:{args.port}{' (login ' + gate.LOGIN_ENV + ')' if login else ''} "
                  f"| database {escape(mask_url(db_url))} ({source}) | MLflow {escape(mask_url(mlflow_uri))}{reader}")
    env = {**mlflow_env, "EXGRPO_DB_URL": db_url, "MLFLOW_TRACKING_URI": mlflow_uri}
    host, port = ("127.0.0.1", gate.free_loopback_port()) if login else (args.host, args.port)
    cmd = [sys.executable, "-m", "streamlit", "run", app, "--server.headless=true", f"--server.port={port}",
           f"--server.address={host}", "--browser.gatherUsageStats=false", "--client.toolbarMode=minimal",
           "--server.fileWatcherType=none"]
    sys.stdout.flush()
    if login:  # Streamlit on a loopback port, the login gate at --host:--port
        return gate.serve(cmd, env, args.host, args.port, login, port)
    os.execve(sys.executable, cmd, env)  # this process becomes Streamlit: signals and Ctrl-C reach it directly


ENV_DASHBOARD_DB_URL = "EXGRPO_DASHBOARD_DB_URL"  # the read-only role's URL, exported by `infra/services.sh env`


def dashboard_db_url(flag: str | None, cfg) -> tuple[str, str]:
    """The dashboard's database URL and where it came from, in words: --db-url, else the config's
    run.db_url, else the read-only role's EXGRPO_DASHBOARD_DB_URL, else as training resolves it
    (EXGRPO_DB_URL, the read/write training role; else the run's SQLite file)."""
    from exgrpo_core.config.redact import reveal_url
    from exgrpo_core.store.experience_store import resolve_db_url

    if flag:  # a masked password (`user:***@`, as `exgrpo train` prints it) comes from EXGRPO_DB_URL
        return reveal_url(flag, "EXGRPO_DB_URL"), "--db-url"
    if cfg.run.db_url:
        return cfg.run.db_url, "run.db_url of the config"
    if os.environ.get(ENV_DASHBOARD_DB_URL):
        return os.environ[ENV_DASHBOARD_DB_URL], f"read-only role, {ENV_DASHBOARD_DB_URL}"
    if os.environ.get("EXGRPO_DB_URL"):
        return os.environ["EXGRPO_DB_URL"], f"training role, EXGRPO_DB_URL; {ENV_DASHBOARD_DB_URL} is not set"
    return resolve_db_url(None, os.path.join(cfg.run.output_dir, cfg.run.name)), "the run's SQLite file"


def cmd_db(args: argparse.Namespace) -> int:
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    url = resolve_db_url(args.url, os.path.abspath(args.run_dir))
    store = ExperienceStore(url)
    head = store.upgrade()
    store.close()
    console.print(f"database at revision {head}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from exgrpo_core.config.load import load_config
    from exgrpo_core.evaluation import report as eval_report

    cfg = load_config(args.config, args.set + ([f"eval.suites={json.dumps(args.suite)}"] if args.suite else []))
    from flows.eval_tasks import load_items

    load_items(cfg)  # a bad suite is one clear error before Prefect starts
    targets = ([("model", m) for m in args.model] + [("checkpoint", c) for c in args.checkpoint]
               + [("run", r) for r in args.run]) or [("model", None)]
    from flows import evaluate as eval_flow
    from flows.prefect_api import serve_prefect_api

    serve_prefect_api()  # Prefect's API dies with this process
    summaries = {}
    for kind, value in targets:
        out = eval_flow.evaluate(preset=cfg.preset, config=cfg, **{kind: value})
        summaries[out["label"]] = out["eval"]
        console.print("[green]evaluated[/green] " + escape(f"{out['source']} (step {out['step']}): run "
                      f"{out['run_id']}, MLflow run {out['mlflow_run_id']}, files in {out['artifacts']}"))
    paths = eval_report.write_table(summaries, args.out, stem="eval_table")
    console.print(paths["md"].read_text(), end="", markup=False)
    console.print(f"table: {paths['md']} (.csv .json .png beside it)", markup=False)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from flows.compare.arms import build_arm_runs, parse_arms, parse_seeds

    arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
    runs = build_arm_runs(args.config, args.set, arms, seeds, args.name or f"compare-{args.config}",
                          not args.no_eval)  # unknown arm or bad override: exit 2 before Prefect starts
    pool = _parallel_options(args, required=False)
    console.print(f"[bold]ExGRPO comparison[/bold]: {len(runs)} runs, arms {','.join(arms)}, seeds {seeds}"
                  + (" (parallel)" if args.parallel else ""))
    from flows.prefect_api import serve_prefect_api

    serve_prefect_api()  # before Prefect is imported; its API dies with this process
    from exgrpo_core.config.redact import hide_overrides  # Prefect records no password
    from flows.compare.flow import compare

    out = compare(preset=args.config, overrides=hide_overrides(args.set), arms=arms, seeds=seeds,
                  evaluate=not args.no_eval, name=args.name, parallel=args.parallel, **pool)
    console.print("[green]done[/green]: " + escape(f"table {out['files']['md']}, MLflow parent run "
                                                  f"{out['parent_mlflow_run_id']}"))
    return 0


def cmd_reverify(args: argparse.Namespace) -> int:
    import datetime
    import json

    from rich.table import Table
    from sqlalchemy.engine import make_url

    from exgrpo_core.config.load import load_config
    from exgrpo_core.config.schema import ExGRPOConfig
    from exgrpo_core.store.engine import StoreError, parse_url
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    cfg = load_config(args.config, args.set) if args.config else ExGRPOConfig()
    db_url = resolve_db_url(args.db_url or cfg.run.db_url, os.path.join(cfg.run.output_dir, args.run))
    if db_url.startswith("sqlite") and not Path(make_url(db_url).database or "").is_file():
        raise StoreError(f"no run {args.run!r}: no experience database at {make_url(db_url).database} "
                         "(name the database with --db-url or --config)")
    parse_url(db_url)
    from exgrpo_core.reward.reverify import find_run, reverify

    with ExperienceStore(db_url) as store:
        find_run(store, args.run)  # an unknown run is one line before the verifier starts
        out = reverify(store, args.run, grader=args.verifier, apply=args.apply)
        name = store.get_run(out["run_id"])["name"]
    s = out["summary"]
    table = Table(title=f"run {name} ({out['run_id'][:8]}): {s['disagree']} of {s['trajectories']} stored rewards "
                        f"disagree with the current verifier")
    for col in ("trajectory", "question", "step", "stored", "now", "prediction", "gold", "reason", "graded by (stored)"):
        table.add_column(col)
    for d in out["disagreements"][:args.limit]:
        table.add_row(str(d["trajectory_id"]), d["question"], str(d["step"] + 1), f"{d['stored_reward']:g}",
                      f"{d['new_reward']:g}", str(d["prediction"]), d["gold"], d["reason"], str(d["stored_verifier"]))
    if out["disagreements"]:
        console.print(table)
    else:
        console.print(table.title)
    if len(out["disagreements"]) > args.limit:
        console.print(f"... and {len(out['disagreements']) - args.limit} more (all in the JSON file)")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = Path(args.out or os.path.join(cfg.run.output_dir, name, f"reverify_{stamp}.json"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2, default=str) + "\n")
    console.print(f"now correct {s['now_correct']}, now wrong {s['now_wrong']}, timeouts {s['timeouts']}; "
                  f"report {dest}")
    if out["applied"]:
        console.print(f"[yellow]applied[/yellow]: {out['applied']['changed']} rewards changed and recorded in "
                      f"reward_changes ({out['applied']['left_pool']} trajectories left the replay pool)")
    elif out["disagreements"]:
        console.print("stored rewards unchanged (--apply changes them, recording each change)")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from flows.compare.arms import parse_seeds
    from flows.compare.grid import build_children

    seeds = parse_seeds(args.seeds)
    children = build_children(args.config, args.set, args.grid, seeds, args.name or f"sweep-{args.config}",
                              not args.no_eval)  # a bad key or value: exit 2 before Prefect starts
    pool = _parallel_options(args, required=True)
    console.print(f"[bold]ExGRPO sweep[/bold]: {len(children)} runs ({len(children) // len(seeds)} grid points "
                  f"x seeds {seeds}) on the deployment's pool")
    from exgrpo_core.config.redact import hide_overrides
    from flows.compare.sweep import sweep

    out = sweep(preset=args.config, grid=args.grid, overrides=hide_overrides(args.set), seeds=seeds,
                evaluate=not args.no_eval, name=args.name, **pool)
    console.print(f"[green]done[/green]: table {out['files']['md']}, MLflow parent run {out['parent_mlflow_run_id']}")
    return 0


def _parallel_options(args: argparse.Namespace, required: bool) -> dict:
    """The work-pool options as flow parameters, checked before anything starts (--parallel needs a server)."""
    from flows.compare import parallel as par

    given = [o for o, v in (("--pool", args.pool), ("--work-queue", args.work_queue), ("--slots", args.slots),
                            ("--retry-failed", args.retry_failed), ("--deployment", args.deployment)) if v]
    if not required and not args.parallel:
        if given:
            raise par.ParallelError(f"{', '.join(given)} only apply with --parallel")
        return {}
    queue = par.QUEUE if args.work_queue is None else args.work_queue
    par.check_args(args.slots, queue)
    return {"work_pool": args.pool, "work_queue": queue, "slots": args.slots, "retry_failed": args.retry_failed,
            "deployment": args.deployment or par.DEPLOYMENT}


def _pool_args(sp) -> None:
    sp.add_argument("--pool", default=None, help="work pool the children must run on (the deployment's pool)")
    sp.add_argument("--work-queue", default=None, help="queue of that pool for the children (default "
                    "exgrpo-children; created when missing)")
    sp.add_argument("--slots", type=int, default=None, help="children running at once: the queue's concurrency "
                    "limit, one per GPU (default: leave the queue's limit as it is)")
    sp.add_argument("--retry-failed", action="store_true", help="resubmit only the children that failed, crashed "
                    "or were cancelled")
    sp.add_argument("--deployment", default=None, help="training deployment of the children (default "
                    "exgrpo-train/exgrpo-train)")


def _config_args(sp, *, required: bool, config_help: str = "preset name (tiny, cpu-demo, paper) or YAML path",
                 set_help: str = "override a config field, e.g. --set rollout.group_size=4 (repeatable)") -> None:
    sp.add_argument("--config", required=required, default=None, help=config_help)
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exgrpo", description="ExGRPO training platform")
    sub = p.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="run the Prefect training flow")
    _config_args(tr, required=True)
    tr.set_defaults(fn=cmd_train)
    co = sub.add_parser("config", help="print the resolved config as YAML, or every key with --help-keys")
    _config_args(co, required=False)
    co.add_argument("--help-keys", nargs="?", const="", default=None, metavar="PREFIX",
                    help="list every config key (type, default, help); PREFIX keeps those starting with it, "
                         "e.g. buffer.")
    co.set_defaults(fn=cmd_config)
    db = sub.add_parser("db", help="experience database")
    db.add_argument("action", choices=["upgrade"])
    db.add_argument("--url", default=None, help="SQLAlchemy URL (default: EXGRPO_DB_URL, else SQLite in --run-dir)")
    db.add_argument("--run-dir", default="runs/exgrpo", help="where the default SQLite file lives")
    db.set_defaults(fn=cmd_db)
    da = sub.add_parser("dashboard", help="start the Streamlit dashboard on the runs' database and MLflow")
    _config_args(da, required=False, config_help="preset or YAML whose database / MLflow to show (as `train`)")
    da.add_argument("--db-url", default=None, help="experience database URL (default: as training resolves it)")
    da.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: as training resolves it)")
    da.add_argument("--port", type=int, default=8501)
    da.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to share it)")
    da.set_defaults(fn=cmd_dashboard)
    cp = sub.add_parser("compare", help="on-policy GRPO vs ExGRPO and ablations as child runs (Prefect flow)")
    _config_args(cp, required=True, set_help="override for every arm")
    cp.add_argument("--arms", default=None,
                    help="comma-separated arms (default: the paper's ablation table; see docs/comparison.md)")
    cp.add_argument("--seeds", default="0", help="seeds, e.g. 0,1 or 0-3: one child run per arm and seed")
    cp.add_argument("--name", default=None, help="comparison name (default compare-<config>); rerun to resume")
    cp.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation of each arm")
    cp.add_argument("--parallel", action="store_true", help="run the children at once as flow runs of the "
                    "training deployment on its work pool (needs PREFECT_API_URL; docs/scaling.md)")
    _pool_args(cp)
    cp.set_defaults(fn=cmd_compare)
    sw = sub.add_parser("sweep", help="a grid of config values x seeds as parallel child runs, one table")
    _config_args(sw, required=True, set_help="override for every child")
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                    help="values of one config key (repeatable: every combination is a grid point)")
    sw.add_argument("--seeds", default="0", help="seeds, e.g. 0,1 or 0-3: one child per grid point and seed")
    sw.add_argument("--name", default=None, help="sweep name (default sweep-<config>); rerun to resume")
    sw.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation of each child")
    _pool_args(sw)
    sw.set_defaults(fn=cmd_sweep)
    ev = sub.add_parser("evaluate", help="evaluate models / checkpoints / runs on benchmark suites (Prefect flow)")
    _config_args(ev, required=True, config_help="preset or YAML: eval settings, output_dir, database, MLflow",
                 set_help="override a config field")
    ev.add_argument("--model", action="append", default=[], help="model name or path (default: model.name_or_path)")
    ev.add_argument("--checkpoint", action="append", default=[], help="checkpoint folder of a training run")
    ev.add_argument("--run", action="append", default=[], help="run name under run.output_dir: latest checkpoint")
    ev.add_argument("--suite", action="append", default=[], help="paper, paper-valid, ood, mmlu-pro (hub), "
                    "gsm8k, bundled:NAME, a .jsonl/.parquet path or hf:NAME (default: eval.suites, else "
                    "data.eval_path)")
    ev.add_argument("--out", default="runs/eval-table", help="where the table of all targets is written")
    ev.set_defaults(fn=cmd_evaluate)
    rv = sub.add_parser("reverify", help="grade a run's stored trajectories again; report (and --apply) disagreements")
    _config_args(rv, required=False, config_help="preset or YAML whose database to read (as `train`)")
    rv.add_argument("--run", required=True, help="run name or id")
    rv.add_argument("--db-url", default=None, help="experience database URL (default: as training resolves it)")
    rv.add_argument("--verifier", choices=["auto", "math", "choice"], default="auto",
                    help="auto: each row's own grader (recorded, else by its question); or one grader for all")
    rv.add_argument("--apply", action="store_true", help="change the disagreeing stored rewards (one transaction, "
                    "each change recorded in reward_changes)")
    rv.add_argument("--out", default=None, help="JSON report path (default: RUN_DIR/reverify_<time>.json)")
    rv.add_argument("--limit", type=int, default=50, help="disagreements shown in the table")
    rv.set_defaults(fn=cmd_reverify)
    ex = sub.add_parser("export", help="write a checkpoint (also one with weight shards) as a Hugging Face folder")
    ex.add_argument("--checkpoint", required=True, help="checkpoint folder, e.g. runs/NAME/checkpoints/step_000050")
    ex.add_argument("--out", required=True, help="folder to write (model safetensors, config, tokenizer)")
    ex.add_argument("--dtype", default="float32", help="weights' dtype in the export (float32, bfloat16, float16)")
    ex.set_defaults(fn=cli_tools.cmd_export)
    rs = sub.add_parser("rollout-server", help="start vLLM's server (what `vllm serve` runs) for rollout.engine=remote "
                        "(a dedicated rollout node); flags after -- go to vLLM")
    rs.add_argument("--model", required=True, help="Hugging Face name or folder: the model the trainer starts from "
                    "(`exgrpo export` turns a checkpoint into one)")
    rs.add_argument("--host", default="127.0.0.1", help="address the trainer connects to; any but loopback needs "
                    "EXGRPO_ROLLOUT_API_KEY, checked on every route by a gate in front of vLLM")
    rs.add_argument("--port", type=int, default=8000)
    rs.add_argument("--dtype", default="bfloat16", help="weights on the server: the trainer's model.dtype")
    rs.add_argument("--seed", type=int, default=0, help="the server's sampling seed (requests carry none)")
    rs.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs each replica spans")
    rs.add_argument("--data-parallel-size", type=int, default=1, help="replicas (GPUs = tensor x data parallel)")
    rs.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share of each GPU")
    rs.add_argument("--max-model-len", type=int, default=None, help="prompt + response tokens")
    rs.add_argument("--weight-transfer", choices=["nccl", "gloo"], default="nccl", help="how the trainer's pushes "
                    "arrive: nccl (GPU to GPU), gloo (over the network; vLLM's CPU build); the trainer's "
                    "rollout.weight_transfer must match")
    rs.add_argument("--python", default=sys.executable, help="the interpreter that has vLLM (default: this one)")
    rs.add_argument("--dry-run", action="store_true", help="print the command and stop")
    rs.add_argument("vllm_args", nargs=argparse.REMAINDER, help="more `vllm serve` flags, after --")
    rs.set_defaults(fn=cli_tools.cmd_rollout_server)
    what_if_cli.add_parser(sub, _config_args)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.fn is not cmd_train:
        console.print(f"[red]error[/red]: only `exgrpo train` runs in several processes; run `exgrpo "
                      f"{args.command}` as one process (not under torchrun / accelerate launch)")
        return 2
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: rerun the same command to resume from the last checkpoint")
        return 130
    except Exception as e:  # noqa: BLE001 - known user errors get one clear line, others a traceback
        if type(e).__name__ == "MonitorStop":  # a monitor's checkpoint_and_stop (docs/monitors.md)
            console.print(f"[red]stopped[/red]: {e}", soft_wrap=True)
            return 3
        if type(e).__name__ in _USER_ERRORS:
            label = getattr(e, "label", "[red]error[/red]")
            getattr(e, "console", console).print(f"{label}: {escape(str(e))}")
            return getattr(e, "exit_code", 2)  # DependencyError: 4, on stderr (flows/dependency_errors.py)
        raise


_USER_ERRORS = {"ConfigError", "DataError", "StoreError", "TrackingError", "ModelLoadError", "ResumeError",
                "VLLMUnavailable", "BudgetError", "RemoteEngineError", "RunLockedError",
                "CheckpointError", "PrefectStartError", "AlreadyFinishedError", "CancelledRun", "ParallelError",
                "ChildrenFailedError", "DependencyError", "RewardPluginError", "RewardServerError", "WhatIfError",
                "RescoreError"}

if __name__ == "__main__":
    sys.exit(main())
