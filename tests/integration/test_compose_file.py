"""docker-compose.yml (Docker cannot run here) is valid YAML and agrees with infra/services.sh."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _script_defaults() -> dict[str, str]:
    """The settings infra/config.sh derives from an empty environment."""
    keys = ["EXGRPO_MLFLOW_PORT", "EXGRPO_PREFECT_PORT", "EXGRPO_PG_PORT", "EXGRPO_DB_PREFIX", "EXGRPO_WORK_POOL",
            "EXGRPO_TRAIN_ROLE", "EXGRPO_DASHBOARD_ROLE", "EXGRPO_SERVICES_ROLE"]
    script = "source infra/config.sh; " + "; ".join(f'echo "{k}=${k}"' for k in keys)
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_every_app_container_runs_the_scripts_serve_command_for_its_own_name():
    assert set(SERVICES) == {"postgres", "db-setup", "mlflow", "prefect", "worker"}
    for name in ("mlflow", "prefect", "worker"):
        assert SERVICES[name]["command"] == ["bash", "infra/services.sh", "serve", name]
        assert f"{name}_cmd()" in (ROOT / "infra" / "services.sh").read_text()
    assert SERVICES["db-setup"]["command"] == ["bash", "infra/services.sh", "db"]
    assert (ROOT / SERVICES["mlflow"]["build"]["dockerfile"]).is_file()


def test_ports_names_and_pool_match_the_script_defaults_and_prefect_yaml():
    defaults = _script_defaults()
    env = SERVICES["worker"]["environment"]
    assert SERVICES["mlflow"]["ports"] == [f"127.0.0.1:{defaults['EXGRPO_MLFLOW_PORT']}:{env['EXGRPO_MLFLOW_PORT']}"]
    assert SERVICES["prefect"]["ports"] == [f"127.0.0.1:{defaults['EXGRPO_PREFECT_PORT']}:{env['EXGRPO_PREFECT_PORT']}"]
    assert env["EXGRPO_PG_PORT"] == defaults["EXGRPO_PG_PORT"]
    for key in ("EXGRPO_DB_PREFIX", "EXGRPO_WORK_POOL", "EXGRPO_TRAIN_ROLE", "EXGRPO_DASHBOARD_ROLE",
                "EXGRPO_SERVICES_ROLE"):
        assert env[key] == defaults[key], key
    assert env["EXGRPO_MLFLOW_URL"] == f"http://mlflow:{defaults['EXGRPO_MLFLOW_PORT']}"
    assert env["EXGRPO_PREFECT_API_URL"] == f"http://prefect:{defaults['EXGRPO_PREFECT_PORT']}/api"
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    assert {d["work_pool"]["name"] for d in deployments} == {"{{ $EXGRPO_WORK_POOL }}"}  # filled in by prefect deploy


def test_no_secret_is_written_in_the_file():
    for name, svc in SERVICES.items():
        for key, value in (svc.get("environment") or {}).items():
            if "PASSWORD" in key:
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", str(value)), f"{name}.{key} must come from the env"


def test_scripts_parse_and_refuse_unknown_commands():
    for script in sorted((ROOT / "infra").glob("*.sh")):
        subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", "infra/services.sh", "serve", "nothing"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr


def test_nothing_is_published_beyond_this_machine_and_postgresql_not_at_all():
    """No login guards MLflow or Prefect: a port on every interface lets anyone who reaches the host read and
    wipe runs or start flow runs (code on the worker); the database needs no port outside compose."""
    assert "ports" not in SERVICES["postgres"] and "expose" not in SERVICES["postgres"]
    for name, svc in SERVICES.items():
        for port in svc.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            assert spec.startswith("127.0.0.1:"), f"{name} publishes {spec} on every interface"


SECRETS = {  # each container's secrets, and no other
    "postgres": {"POSTGRES_PASSWORD"},
    "db-setup": {"PGPASSWORD", "EXGRPO_TRAIN_PASSWORD", "EXGRPO_DASHBOARD_PASSWORD", "EXGRPO_SERVICES_PASSWORD"},
    "mlflow": {"EXGRPO_SERVICES_PASSWORD", "EXGRPO_MLFLOW_ADMIN_PASSWORD"},
    "prefect": {"EXGRPO_SERVICES_PASSWORD", "EXGRPO_PREFECT_AUTH_STRING"},
    "worker": {"EXGRPO_TRAIN_PASSWORD", "EXGRPO_MLFLOW_ADMIN_PASSWORD", "EXGRPO_PREFECT_AUTH_STRING",
               "PREFECT_API_AUTH_STRING"},
}


def test_each_container_gets_only_its_own_secrets_and_requires_them():
    for name, svc in SERVICES.items():
        env = svc.get("environment") or {}
        secret = {k for k, v in env.items() if re.search(r"PASSWORD|AUTH_STRING", k) or "PASSWORD" in str(v)}
        assert secret == SECRETS[name], name
        for key in secret:
            assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", str(env[key])), f"{name}.{key}: required from .env"


def test_no_service_shares_a_folder_with_the_pass_file_of_every_role():
    """db-setup writes every role's password to its /state/pgpass; a service writes its own role's only."""
    assert not SERVICES["db-setup"].get("volumes")
    mounts = {name: {v.split(":")[0] for v in svc.get("volumes", [])} for name, svc in SERVICES.items()}
    for a in ("mlflow", "prefect", "worker"):
        for b in ("mlflow", "prefect", "worker"):
            if a < b:
                assert not mounts[a] & mounts[b], (a, b, mounts[a] & mounts[b])


def test_a_served_container_writes_a_pass_file_with_its_own_role_only(tmp_path):
    fake = tmp_path / "python"  # stands in for the service: records the environment it was started with
    fake.write_text('#!/bin/sh\nenv > "$FAKE_OUT"\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "EXGRPO_PYTHON": str(fake), "FAKE_OUT": str(
        tmp_path / "env"), "EXGRPO_STATE_DIR": str(tmp_path / "state"), "EXGRPO_TRAIN_PASSWORD": "train-secret"}
    out = subprocess.run(["bash", "infra/services.sh", "serve", "worker"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pgpass = tmp_path / "state" / "pgpass"
    assert pgpass.read_text() == "127.0.0.1:5432:*:exgrpo_train:train-secret\n"
    assert pgpass.stat().st_mode & 0o777 == 0o600
    seen = (tmp_path / "env").read_text()
    assert f"PGPASSFILE={pgpass}" in seen and "train-secret" not in seen  # the password only through the file
