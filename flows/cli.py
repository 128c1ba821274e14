"""`exgrpo` command line: train through the Prefect flow with a progress display; manage the database.

    exgrpo train --config configs/tiny.yaml --set run.steps=5
    torchrun --nproc_per_node 2 -m flows.cli train --config tiny   # two processes (docs/scaling.md)
    exgrpo config --config cpu-demo --set rollout.group_size=4     # print the resolved config
    exgrpo db upgrade [--url URL]
    exgrpo dashboard --config cpu-demo [--port 8501]              # Streamlit dashboard, read-only
    exgrpo compare --config tiny --arms on_policy,exgrpo --seeds 0,1   # child runs + comparison table
    exgrpo evaluate --config cpu-demo --run cpu-demo --suite gsm8k   # a run's latest checkpoint
    exgrpo evaluate --config paper --model Qwen/Qwen2.5-Math-7B --suite paper --suite ood   # Table 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

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
    if int(os.environ.get("RANK", "0")) > 0:  # a follower under torchrun / accelerate launch: no Prefect, no DB
        from exgrpo_core.session import run_follower

        run_follower(cfg)
        return 0
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    existed = run_dir.exists()
    try:
        _preflight(cfg, run_dir)  # user errors (data, database, MLflow, a second process) before Prefect starts
        console.print(f"[bold]ExGRPO[/bold] preset={cfg.preset} model={cfg.model.name_or_path} "
                      f"steps={cfg.run.steps} run_dir={os.path.join(cfg.run.output_dir, cfg.run.name)}")
        if not os.environ.get("PREFECT_API_URL"):
            console.print("starting Prefect's ephemeral API (set PREFECT_API_URL to use a server)...")
        from flows.prefect_api import serve_prefect_api

        serve_prefect_api()  # before Prefect is imported; its API dies with this process (issue 16, item 6)
        from flows import train as train_flow

        train_flow.PROGRESS.append(_progress_line)
        summary = train_flow.train(preset=cfg.preset, config=cfg)
    except BaseException:
        if not existed and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".lock"}:
            shutil.rmtree(run_dir, ignore_errors=True)  # a failed start leaves no empty run directory
        raise
    console.print(f"[green]done[/green]: run {summary['run_id']} ({summary['steps']} steps), "
                  f"MLflow run {summary['mlflow_run_id']}, run dir {summary['run_dir']}")
    return 0


def _preflight(cfg, run_dir: Path) -> None:
    """Find user errors in seconds, before Prefect's server and the flow start: the dataset, the database
    (a server must answer), the MLflow server, another process on the run, a damaged checkpoint."""
    from exgrpo_core import checkpoint, data
    from exgrpo_core.locks import lock_run
    from exgrpo_core.store.engine import create_store_engine, parse_url
    from exgrpo_core.store.experience_store import resolve_db_url
    from flows.tracking import check_server

    data.load_questions(cfg.data.train_path, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
                        max_questions=cfg.data.max_questions)
    run_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite database lives in it (removed if the start fails)
    db_url = resolve_db_url(cfg.run.db_url, run_dir)
    url = parse_url(db_url)
    if url.get_backend_name() != "sqlite":
        create_store_engine(url).dispose()  # connects once: an unreachable server is one line
    uri = cfg.run.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_server(uri)  # a server must answer; the default local store is created by the flow
    lock_run(run_dir, cfg.run.name, db_url)  # a second process on this run is refused here
    if cfg.run.resume != "never":
        checkpoint.resume_point(run_dir)  # a damaged checkpoint: set aside with a warning, or one line


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from exgrpo_core.config_io import load_config

    cfg = load_config(args.config, args.set)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import importlib.util

    from exgrpo_core.config import ExGRPOConfig
    from exgrpo_core.config_io import load_config
    from exgrpo_core.store.experience_store import resolve_db_url
    from exgrpo_core.store.engine import mask_url, parse_url
    from flows.tracking import resolve_tracking_uri

    cfg = load_config(args.config, args.set) if args.config else ExGRPOConfig()
    db_url = resolve_db_url(args.db_url or cfg.run.db_url, os.path.join(cfg.run.output_dir, cfg.run.name))
    if not db_url.startswith("sqlite"):  # a bad server URL is one clear error; a missing SQLite file (or
        parse_url(db_url)                # folder) is explained on the page until training creates it
    mlflow_uri = args.mlflow_uri or resolve_tracking_uri(cfg)
    app = os.path.join(os.path.dirname(importlib.util.find_spec("dashboard").origin), "app.py")
    console.print(f"dashboard on http://{args.host}:{args.port} | database {mask_url(db_url)} | MLflow {mlflow_uri}")
    env = {**os.environ, "EXGRPO_DB_URL": db_url, "MLFLOW_TRACKING_URI": mlflow_uri}
    cmd = [sys.executable, "-m", "streamlit", "run", app, "--server.headless=true", f"--server.port={args.port}",
           f"--server.address={args.host}", "--browser.gatherUsageStats=false", "--client.toolbarMode=minimal",
           "--server.fileWatcherType=none"]
    sys.stdout.flush()
    os.execve(sys.executable, cmd, env)  # this process becomes Streamlit: signals and Ctrl-C reach it directly


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

    from exgrpo_core.evaluation import report as eval_report
    from exgrpo_core.config_io import load_config

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
        console.print(f"[green]evaluated[/green] {out['source']} (step {out['step']}): run {out['run_id']}, "
                      f"MLflow run {out['mlflow_run_id']}, files in {out['artifacts']}")
    paths = eval_report.write_table(summaries, args.out, stem="eval_table")
    console.print(paths["md"].read_text(), end="")
    console.print(f"table: {paths['md']} (.csv .json .png beside it)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from flows.compare_arms import build_arm_runs, parse_arms, parse_seeds

    arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
    runs = build_arm_runs(args.config, args.set, arms, seeds, args.name or f"compare-{args.config}",
                          not args.no_eval)  # unknown arm or bad override: exit 2 before Prefect starts
    console.print(f"[bold]ExGRPO comparison[/bold]: {len(runs)} runs, arms {','.join(arms)}, seeds {seeds}")
    from flows.prefect_api import serve_prefect_api

    serve_prefect_api()  # before Prefect is imported; its API dies with this process
    from flows.compare import compare

    out = compare(preset=args.config, overrides=args.set, arms=arms, seeds=seeds, evaluate=not args.no_eval,
                  name=args.name)
    console.print(f"[green]done[/green]: table {out['files']['md']}, MLflow parent run {out['parent_mlflow_run_id']}")
    return 0


def _config_args(sp, *, required: bool, config_help: str = "preset name (tiny, cpu-demo, paper) or YAML path",
                 set_help: str = "override a config field, e.g. --set rollout.group_size=4 (repeatable)") -> None:
    sp.add_argument("--config", required=required, default=None, help=config_help)
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)


def cmd_rollout_server(args: argparse.Namespace) -> int:
    from exgrpo_core.rollout.server import RolloutServer, build_backend

    backend, tokenizer = build_backend(args.model, args.backend, dtype=args.dtype, batch_size=args.batch_size,
                                       tensor_parallel_size=args.tensor_parallel_size,
                                       gpu_memory_utilization=args.gpu_memory_utilization,
                                       max_model_len=args.max_model_len)
    try:
        server = RolloutServer(backend, tokenizer, model_name=args.model, host=args.host, port=args.port)
    except OSError as e:  # e.g. the port is taken by another server
        console.print(f"[red]error[/red]: cannot listen on {args.host}:{args.port}: {e.strerror or e}")
        return 2
    console.print(f"rollout server ({args.backend}, {args.model}) on {server.url}: train with "
                  f"--set rollout.engine=remote --set rollout.server_url={server.url}")
    try:
        server.serve_forever()
    finally:
        server.stop()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from exgrpo_core.models import ModelLoadError, load_policy, save_policy

    if not Path(args.checkpoint).expanduser().is_dir():
        raise ModelLoadError(f"checkpoint {args.checkpoint}: no such directory")
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"--out {args.out} already exists and is not an empty folder; pick a new one "
                             "(export never overwrites)")
    model, tokenizer = load_policy(args.checkpoint, dtype=args.dtype)
    save_policy(model, tokenizer, args.out)
    console.print(f"exported {args.checkpoint} to {args.out} (a Hugging Face folder: transformers, vLLM)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exgrpo", description="ExGRPO training platform")
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("train", cmd_train, "run the Prefect training flow"),
                            ("config", cmd_config, "print the resolved config")):
        sp = sub.add_parser(name, help=help_)
        _config_args(sp, required=True)
        sp.set_defaults(fn=fn)
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
    cp.add_argument("--arms", default=None, help="comma-separated arms (default: all; see docs/comparison.md)")
    cp.add_argument("--seeds", default="0", help="comma-separated seeds, one child run per arm and seed")
    cp.add_argument("--name", default=None, help="comparison name (default compare-<config>); rerun to resume")
    cp.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation of each arm")
    cp.set_defaults(fn=cmd_compare)
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
    ex = sub.add_parser("export", help="write a checkpoint (also one with weight shards) as a Hugging Face folder")
    ex.add_argument("--checkpoint", required=True, help="checkpoint folder, e.g. runs/NAME/checkpoints/step_000050")
    ex.add_argument("--out", required=True, help="folder to write (model safetensors, config, tokenizer)")
    ex.add_argument("--dtype", default="float32", help="weights' dtype in the export (float32, bfloat16, float16)")
    ex.set_defaults(fn=cmd_export)
    rs = sub.add_parser("rollout-server", help="serve rollouts for rollout.engine=remote (a dedicated rollout node)")
    rs.add_argument("--model", required=True, help="model name or path: the same one the trainer starts from")
    rs.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    rs.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for other nodes)")
    rs.add_argument("--port", type=int, default=8009)
    rs.add_argument("--dtype", default="float32", help="weights on the server (vLLM: bfloat16)")
    rs.add_argument("--batch-size", type=int, default=64, help="(transformers) sequences per generate call")
    rs.add_argument("--tensor-parallel-size", type=int, default=1, help="(vllm) GPUs the engine spans")
    rs.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="(vllm) share of each GPU")
    rs.add_argument("--max-model-len", type=int, default=None, help="(vllm) prompt + response tokens")
    rs.set_defaults(fn=cmd_rollout_server)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no phoning home from the API
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
        if type(e).__name__ in _USER_ERRORS:
            console.print(f"[red]error[/red]: {e}")
            return 2
        raise


_USER_ERRORS = {"ConfigError", "DataError", "StoreError", "TrackingError", "ModelLoadError", "ResumeError",
                "VLLMUnavailable", "BudgetError", "RemoteEngineError", "RunLockedError",
                "CheckpointError", "PrefectStartError"}

if __name__ == "__main__":
    sys.exit(main())
