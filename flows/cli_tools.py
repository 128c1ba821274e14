"""`exgrpo rollout-server` and `exgrpo export`: the commands that serve or hand over a model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape

console = Console(highlight=False, soft_wrap=True)


def cmd_rollout_server(args: argparse.Namespace) -> int:
    """Run a stock `vllm serve` with the flags rollout.engine=remote needs (printed first; --dry-run stops there)."""
    from exgrpo_core.rollout.remote import API_KEY_ENV, PIP_HINT, bind_flag, serve_command, serve_env
    from flows.rollout_gate import short_key

    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    bound = next((a for a in extra if bind_flag(a)), None)
    if bound:  # vLLM keeps the last --host: it would move past the key gate's private socket
        console.print("[red]error[/red]: " + escape(f"{bound} after `--` would override where vLLM listens "
                                                    "(and the key gate's private socket): use exgrpo "
                                                    "rollout-server's own --host / --port"))
        return 2
    cmd = serve_command(args.model, python=args.python, host=args.host, port=args.port, dtype=args.dtype,
                        seed=args.seed, tensor_parallel_size=args.tensor_parallel_size,
                        data_parallel_size=args.data_parallel_size, gpu_memory_utilization=args.gpu_memory_utilization,
                        max_model_len=args.max_model_len, weight_transfer=args.weight_transfer, extra=extra)
    key = os.environ.get(API_KEY_ENV)
    if short_key(key):
        console.print("[red]error[/red]: " + escape(short_key(key)))
        return 2
    if not key and args.host not in ("127.0.0.1", "localhost", "::1"):  # the weight routes would be open
        console.print("[red]error[/red]: " + escape(f"--host {args.host} lets other machines pause the server and "
                                                    f"replace its weights: set {API_KEY_ENV} (the trainer sends "
                                                    "the same; docs/scaling.md)"))
        return 2
    env, shown = serve_env(cmd)
    print(shown, flush=True)
    if key:
        print(f"(run on a Unix socket in a 0700 folder, --uds in place of --host/--port, behind a key gate at "
              f"{args.host}:{args.port}: every route but GET /health needs Authorization: Bearer ${API_KEY_ENV}; "
              "flows/rollout_gate.py)", flush=True)
    host = "rollout-node" if args.host in ("0.0.0.0", "::") else args.host
    print(f"train with: --set rollout.engine=remote --set rollout.server_url=http://{host}:{args.port}"
          f" --set model.dtype={args.dtype} --set rollout.weight_transfer={args.weight_transfer}", flush=True)
    if args.dry_run:
        return 0
    if not has_vllm(args.python):
        console.print("[red]error[/red]: " + escape(f"`exgrpo rollout-server` runs vLLM's server, which {args.python} "
                                                    f"cannot import: `{PIP_HINT}` on the rollout node (or --python "
                                                    "an interpreter that has vLLM)"))
        return 2
    if key:
        from flows import rollout_gate

        return rollout_gate.serve(cmd, env, args.host, args.port, key)
    os.execve(cmd[0], cmd, {**os.environ, **env})  # replaces this process: signals and exit code are vLLM's


def has_vllm(python: str) -> bool:
    """`python` can import vLLM (found without importing it)."""
    import subprocess

    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError:
        return False


def cmd_export(args: argparse.Namespace) -> int:
    from exgrpo_core.models.build import save_policy
    from exgrpo_core.models.load import ModelLoadError, load_policy

    if not Path(args.checkpoint).expanduser().is_dir():
        raise ModelLoadError(f"checkpoint {args.checkpoint}: no such directory")
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"--out {args.out} already exists and is not an empty folder; pick a new one "
                             "(export never overwrites)")
    model, tokenizer = load_policy(args.checkpoint, dtype=args.dtype)
    save_policy(model, tokenizer, args.out)
    console.print(f"exported {args.checkpoint} to {args.out} (a Hugging Face folder: transformers, vLLM)", markup=False)
    return 0
