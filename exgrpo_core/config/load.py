"""Load an `ExGRPOConfig` from a YAML preset plus `--set dotted.key=value` overrides.

Presets live in `configs/`; a bare name (`tiny`) resolves there, a path is read as is. Override
values are parsed as YAML scalars (`3`, `1e-6`, `true`, `null`, `[1, 2]`), except that a string-typed key
keeps `off` or `2026` as written. Errors name the key.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from exgrpo_core.config.keys import config_keys
from exgrpo_core.config.schema import ConfigError, ExGRPOConfig

PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs"


def resolve_preset(name_or_path: str) -> Path:
    """Map `tiny` / `configs/tiny.yaml` / an absolute path to an existing YAML file."""
    p = Path(name_or_path)
    candidates = [p, PRESETS_DIR / name_or_path, PRESETS_DIR / f"{name_or_path}.yaml"]
    for c in candidates:
        if c.is_file():
            return c
    known = sorted(x.stem for x in PRESETS_DIR.glob("*.yaml"))
    raise ConfigError(f"config '{name_or_path}' not found (neither a file nor a preset; presets: {known})")


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=3` -> (["a", "b"], 3)."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' must look like dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{item}' has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from e
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set each dotted key in a nested dict (creating sections as needed)."""
    for item in overrides:
        path, value = parse_override(item)
        if isinstance(value, (bool, int, float)) and ".".join(path) in _string_keys():
            value = item.split("=", 1)[1].strip()  # `run.name=off` / `=2026` is a name, not False / 2026
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override '{item}': '{part}' is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return data


@functools.cache
def _key_types() -> dict[str, frozenset[str]]:
    """Every leaf key's accepted value types, as words (`{"int", "null"}`, `{"auto", "on", "off"}`)."""
    return {k.key: frozenset(k.type.split(" | ")) for k in config_keys()}


def _string_keys() -> set[str]:
    """Keys whose only value types are strings (and null): an unquoted `off`, `123` there stays text."""
    return {key for key, types in _key_types().items() if types <= {"str", "null"}}


def _stray_booleans(data: dict) -> list[str]:
    """Keys given a YAML boolean (`off`, `no`, `yes`, `true`) that take no boolean: pydantic would read
    `seed: off` as 0, so each is an error naming the key."""
    types = _key_types()
    out = []

    def walk(prefix: str, node: dict) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if isinstance(value, dict) and key not in types:
                walk(f"{key}.", value)
            elif isinstance(value, bool) and key in types and not types[key] & {"bool", "on", "off"}:
                hint = "; quote it to mean the text" if types[key] & {"str"} else ""
                out.append(f"  {key}: {str(value).lower()} is a boolean in YAML (off/no/yes/on too), and this "
                           f"key takes {' | '.join(sorted(types[key]))}{hint}")

    walk("", data)
    return out


def build_config(data: dict, source: str = "config") -> ExGRPOConfig:
    """Validate a nested dict into the config tree with readable errors."""
    stray = _stray_booleans(data)
    if stray:
        raise ConfigError(f"invalid {source}:\n" + "\n".join(stray))
    try:
        return ExGRPOConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(root)"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = unknown_key_hint(loc)
            lines.append(f"  {loc}: {msg}")
        raise ConfigError(f"invalid {source}:\n" + "\n".join(lines)) from None


def unknown_key_hint(key: str) -> str:
    """`unknown key (did you mean rollout.temperature?; ...)`, pointing at `exgrpo config --help-keys`."""
    import difflib

    keys = [k.key for k in config_keys()]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    section = key.split(".")[0] + "." if "." in key and any(k.startswith(key.split(".")[0] + ".") for k in keys) else ""
    guess = f"did you mean {close[0]}? " if close else "check spelling; "
    return f"unknown key ({guess}see `exgrpo config --help-keys {section}`)".replace(" `)", "`)")


def load_config(name_or_path: str, overrides: list[str] | None = None) -> ExGRPOConfig:
    """Read a preset or YAML file, apply overrides, validate."""
    path = resolve_preset(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    data.setdefault("preset", path.stem)
    apply_overrides(data, list(overrides or []))
    return build_config(data, source=f"config {path.name}")


def flatten(cfg: ExGRPOConfig) -> dict[str, Any]:
    """`{"rollout.group_size": 8, ...}`: the resolved config as MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = node

    walk("", cfg.model_dump(mode="json"))
    return out
