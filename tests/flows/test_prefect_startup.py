"""Importing flows raises Prefect's ephemeral server start-up timeout (issue 15, part 5); the env still wins."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import flows.train\nfrom prefect.settings import get_current_settings\n"
         "print(get_current_settings().server.ephemeral.startup_timeout_seconds)")


def _timeout(env_value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    if env_value is not None:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = env_value
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_flows_raise_the_ephemeral_startup_timeout_unless_the_user_set_it():
    import flows

    assert _timeout(None) == flows.EPHEMERAL_STARTUP_TIMEOUT_S > 20
    assert _timeout("33") == 33


def test_flows_turn_the_api_servers_analytics_off_unless_the_user_set_it():
    probe = ("import flows.train\nfrom prefect.settings import get_current_settings\n"
             "print(get_current_settings().server.analytics_enabled)")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_ANALYTICS_ENABLED"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    def run(extra: dict) -> str:
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, **extra}, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip().splitlines()[-1]

    assert run({}) == "False"
    assert run({"PREFECT_SERVER_ANALYTICS_ENABLED": "true"}) == "True"
