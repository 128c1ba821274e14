"""Credentials never recorded: one place that masks them wherever a config or URL is written down
(MLflow params, tags and config.yaml, `runs.config_json`, Prefect flow-run parameters).

A URL's password (`scheme://user:PASSWORD@host`) and secret query values (`password=`, `token=`, ...) become
`***`; config fields that are secrets themselves (`rollout.server_api_key`) become `***` when set.
`hide` gives a config safe to pass as Prefect parameters (its credentials moved to the environment).
"""

from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"
SECRET_FIELDS = ("server_api_key",)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s/]+)@")
_QUERY = re.compile(r"(?i)(?P<head>[?&;](?:password|passwd|pwd|token|api_key|apikey|secret)=)(?P<secret>[^&\s]+)")
ENV_FALLBACK = {("run", "db_url"): "EXGRPO_DB_URL", ("run", "mlflow_tracking_uri"): "MLFLOW_TRACKING_URI",
                ("rollout", "server_api_key"): "EXGRPO_ROLLOUT_API_KEY"}


def mask_text(text: str) -> str:
    """`text` (a URL, a command line) with every URL password and secret query value replaced by ***."""
    text = _USERINFO.sub(lambda m: m["head"] + MASK + "@", text)
    return _QUERY.sub(lambda m: m["head"] + MASK, text)


def masked(value: Any) -> Any:
    """A JSON-like tree (a dumped config, parameters) with credentials masked; the input is not changed."""
    if isinstance(value, dict):
        return {k: (MASK if str(k).rsplit(".", 1)[-1] in SECRET_FIELDS and v else masked(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked(v) for v in value)
    return mask_text(value) if isinstance(value, str) else value


def has_secrets(value: Any) -> bool:
    return masked(value) != value


def masked_config(cfg) -> dict:
    """The config as JSON-ready dict with credentials masked (what is recorded)."""
    return masked(cfg.model_dump(mode="json"))


def hide(cfg):
    """A copy of `cfg` to pass as Prefect flow-run parameters: each field holding a credential is emptied
    and its value moved to the environment variable the run falls back to (EXGRPO_DB_URL,
    MLFLOW_TRACKING_URI, EXGRPO_ROLLOUT_API_KEY), which this process and the ones it starts read."""
    updates: dict[str, dict] = {}
    for (section, key), env in ENV_FALLBACK.items():
        value = getattr(getattr(cfg, section), key)
        if value and (key in SECRET_FIELDS or mask_text(value) != value):
            os.environ[env] = value
            updates.setdefault(section, {})[key] = None
    if not updates:
        return cfg
    return cfg.model_copy(update={s: getattr(cfg, s).model_copy(update=u) for s, u in updates.items()})
