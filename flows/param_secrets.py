"""No credential stays in a Prefect flow run's stored parameters.

A password typed into a deployment's Run form (`run.db_url=postgresql://user:pw@host/db` in `overrides`,
or the `config` tree) reaches Prefect's database before any of our code runs. `scrub_parameters`, called
as the flow run starts, rewrites that flow run's parameters with every credential masked
(exgrpo_core/config/redact.py); the run itself keeps using the value it was given. A Retry or a hook
reads the masked parameters back, and `reveal` fills the password in from the worker's environment
(EXGRPO_DB_URL naming the same database, else libpq's pass file).
"""

from __future__ import annotations

from exgrpo_core.config.redact import has_secrets, masked


def scrub_parameters(params: dict, flow_run_id) -> bool:
    """Mask the credentials in the stored parameters of flow run `flow_run_id` when `params` (what the
    run was given) hold any; returns whether it rewrote them. A failure is one printed line, not an error."""
    from pydantic_core import to_jsonable_python

    if flow_run_id is None or not has_secrets(to_jsonable_python(params, fallback=str)):
        return False
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            stored = client.read_flow_run(flow_run_id).parameters
            client.update_flow_run(flow_run_id, parameters=masked(stored))
    except Exception as e:  # noqa: BLE001
        print(f"warning: could not mask the credentials in flow run {flow_run_id}'s parameters "
              f"({type(e).__name__}); its parameters in Prefect hold a password")
        return False
    print("credentials in this flow run's parameters were masked in Prefect (the run uses them as given)")
    return True


def scrub_this_flow_run(params: dict) -> bool:
    """`scrub_parameters` for the flow run this code runs in (none outside a flow run)."""
    from prefect.runtime import flow_run

    return scrub_parameters(params, flow_run.get_id())
