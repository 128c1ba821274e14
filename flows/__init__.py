"""Prefect flows and the `exgrpo` CLI: orchestration and MLflow tracking around `exgrpo_core`.

Importing any `flows` module first gives Prefect's ephemeral API server (used when PREFECT_API_URL
is unset) 180 s to start instead of Prefect's 20 s default, which a loaded machine exceeded and
which killed long benchmark runs (issue 15). Prefect reads its settings when it is imported, so this
runs before any submodule imports it; an explicit PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
in the environment wins. Prefect's API server also stops phoning home (analytics off; the
machines this runs on often have no internet, where each try logged an ERROR line).
"""

import os

EPHEMERAL_STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
EPHEMERAL_STARTUP_TIMEOUT_S = 180
os.environ.setdefault(EPHEMERAL_STARTUP_TIMEOUT_ENV, str(EPHEMERAL_STARTUP_TIMEOUT_S))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
