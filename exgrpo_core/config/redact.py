"""Credentials never recorded: one place that masks them wherever a config or URL is written down
(MLflow params, tags and config.yaml, `runs.config_json`, Prefect flow-run parameters).

A URL's password (`scheme://user:PASSWORD@host`) and secret query values (`password=`, `token=`, ...) become
`***`; config fields that are secrets themselves (`rollout.server_api_key`) become `***` when set.
`hide` gives a config safe to pass as Prefect parameters (its credentials moved to the environment);
`hide_overrides` does the same for `key=value` overrides. A masked value (`user:***@host`, a secret
field `***`) stands for "the secret is in the environment": `reveal_url` / `reveal` fill it back in
from the variable the field falls back to when that names the same server, user and database, else
drop the password (libpq's pass file, PGPASSFILE, supplies it).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit

MASK = "***"
SECRET_FIELDS = ("server_api_key", "url_api_key")
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s/]+)@")
_FIELD = re.compile(r"(?P<head>\b(?:" + "|".join(SECRET_FIELDS) + r")=)(?P<secret>[^\s&]+)")  # key=value overrides
FIELD_MASK = "'***'"  # an override value that still parses (YAML) to the mask
_QUERY = re.compile(r"(?i)(?P<head>[?&;](?:password|passwd|pwd|token|api_key|apikey|secret)=)(?P<secret>[^&\s]+)")
ENV_FALLBACK = {("run", "db_url"): "EXGRPO_DB_URL", ("run", "mlflow_tracking_uri"): "MLFLOW_TRACKING_URI",
                ("rollout", "server_api_key"): "EXGRPO_ROLLOUT_API_KEY", ("reward", "url"): "EXGRPO_REWARD_URL",
                ("reward", "url_api_key"): "EXGRPO_REWARD_API_KEY"}
KEEP_MASKED = frozenset({("reward", "url")})
"""Fields whose None does not fall back to the environment: `hide` leaves them masked (user:***@host), not empty."""


def mask_text(text: str) -> str:
    """`text` (a URL, a command line) with every URL password and secret query value replaced by ***."""
    text = _USERINFO.sub(lambda m: m["head"] + MASK + "@", text)
    text = _FIELD.sub(lambda m: m["head"] + FIELD_MASK, text)
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
    MLFLOW_TRACKING_URI, EXGRPO_ROLLOUT_API_KEY, EXGRPO_REWARD_URL, EXGRPO_REWARD_API_KEY), which this process
    and the ones it starts read; reward.url stays masked there (its None means no reward server)."""
    updates: dict[str, dict] = {}
    for (section, key), env in ENV_FALLBACK.items():
        value = getattr(getattr(cfg, section), key)
        if value and (key in SECRET_FIELDS or mask_text(value) != value):
            os.environ[env] = value
            updates.setdefault(section, {})[key] = mask_text(value) if (section, key) in KEEP_MASKED else None
    if not updates:
        return cfg
    return cfg.model_copy(update={s: getattr(cfg, s).model_copy(update=u) for s, u in updates.items()})


def hide_overrides(overrides: list[str] | None) -> list[str] | None:
    """`key=value` overrides to pass as Prefect parameters: a credential (run.db_url with a password,
    rollout.server_api_key, ...) moves to its environment variable and the override keeps it masked."""
    if not overrides:
        return overrides
    envs = {f"{s}.{k}": env for (s, k), env in ENV_FALLBACK.items()}
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        env = envs.get(key.strip())
        shown = mask_text(item)
        if env and sep and shown != item:
            os.environ[env] = value
            item = shown
        out.append(item)
    return out


def _target(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme.split("+")[0], parts.username, parts.hostname, parts.port, parts.path


def reveal_url(url: str | None, env: str) -> str | None:
    """A URL whose password is *** with the password of env `env` when that URL names the same server,
    user and database; else the URL without a password. Any other value is returned as is."""
    if not url or f":{MASK}@" not in url:
        return url
    other = os.environ.get(env, "")
    try:
        found = urlsplit(other).password is not None and _target(other) == _target(url)
    except ValueError:
        found = False
    if found:
        secret = urlsplit(other).netloc.rsplit("@", 1)[0].split(":", 1)[1]  # as written (percent-encoded)
        return url.replace(f":{MASK}@", f":{secret}@", 1)
    return url.replace(f":{MASK}@", "@", 1)


def reveal(cfg):
    """`cfg` with each masked credential field filled back in from its environment variable (`reveal_url`;
    a secret field from the variable itself); `cfg` itself when nothing is masked."""
    updates: dict[str, dict] = {}
    for (section, key), env in ENV_FALLBACK.items():
        value = getattr(getattr(cfg, section), key)
        if key in SECRET_FIELDS:
            new = (os.environ.get(env) or None) if value == MASK else value
        else:
            new = reveal_url(value, env)
        if new != value:
            updates.setdefault(section, {})[key] = new
    if not updates:
        return cfg
    return cfg.model_copy(update={s: getattr(cfg, s).model_copy(update=u) for s, u in updates.items()})
