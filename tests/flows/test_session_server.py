"""The session's Prefect server fixture reaches in-process clients even when Prefect was imported first.

Prefect reads PREFECT_API_URL at import; this module imports it at collection, before the fixture
starts the server, which is the situation of every full test run.
"""

from __future__ import annotations

import prefect  # noqa: F401 - imported at collection on purpose
from prefect.client.orchestration import get_client


def test_in_process_clients_use_the_session_server(prefect_server):
    assert str(get_client(sync_client=True).api_url).rstrip("/") == prefect_server.rstrip("/")
