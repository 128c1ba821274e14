"""`prefect deploy --all` puts every deployment on the work pool infra/services.sh runs its worker on
(EXGRPO_WORK_POOL, exported by `infra/services.sh env`), not on a pool named in prefect.yaml: a real
`prefect deploy` against a real Prefect server, as tests/integration/test_services.py deploys."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _services_env(pool: str) -> dict[str, str]:
    """The exports `infra/services.sh env` prints for a custom pool."""
    out = subprocess.run(["bash", "infra/services.sh", "env"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                              "EXGRPO_WORK_POOL": pool}, check=True).stdout
    lines = [line.removeprefix("export ").split("=", 1) for line in out.splitlines() if line.startswith("export ")]
    return {k: v.strip("'") for k, v in lines}


def test_deploy_all_uses_the_services_work_pool(prefect_server):
    pool = f"custom-{uuid.uuid4().hex[:6]}"
    exported = _services_env(pool)
    assert exported["EXGRPO_WORK_POOL"] == pool
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "EXGRPO_REPO_DIR": str(ROOT),
           "EXGRPO_WORK_POOL": exported["EXGRPO_WORK_POOL"]}
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", pool, "--type", "process"], env=env, check=True,
                   capture_output=True, timeout=120)
    out = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    names = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]]
    with temporary_settings(updates={PREFECT_API_URL: prefect_server}), get_client(sync_client=True) as client:
        pools = {n: client.read_deployment_by_name(f"{n}/{n}").work_pool_name for n in names}
    assert pools == {n: pool for n in names}, pools
