"""`exgrpo config --help-keys`: every config key with its type, default and one line of help.

The help is each field's docstring in `exgrpo_core/config/` (schema.py and its parts; pydantic keeps it as the
field's description); `missing_help` lists the keys without one, and a test keeps that list empty.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass

import yaml
from pydantic import BaseModel

from exgrpo_core.config.schema import ConfigError, ExGRPOConfig


@dataclass(frozen=True)
class KeyHelp:
    key: str
    """Dotted key as `--set` takes it, e.g. `buffer.replay_ratio`."""
    type: str
    """The accepted values in words: `int`, `float | null`, `auto | never | must`."""
    default: str
    """The default as YAML would write it."""
    help: str
    """The first sentence of the field's docstring, on one line."""


def _is_section(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def type_name(annotation) -> str:
    """A field's annotation as a user writes values: `int`, `str | null`, `full | sharded`, `list[int]`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if origin is list:
        return f"list[{', '.join(type_name(a) for a in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def yaml_value(value) -> str:
    """`value` as YAML writes it inline (`null`, `1.0e-06`, `[8]`, a string quoted only when it must be)."""
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 30, allow_unicode=True).strip()[1:-1]


def first_sentence(text: str | None) -> str:
    """The docstring's first sentence with its line breaks folded, and the next one when it says what
    None means: one line of help ('' for none)."""
    flat = " ".join((text or "").split())
    ends = [m.start() + 1 for m in re.finditer(r"\.(?=\s+[A-Z`]|$)", flat)]  # before a capital, ` or the end
    if not ends:
        return flat
    n = 2 if len(ends) > 1 and flat[ends[0]:].lstrip().startswith("None:") else 1
    return flat[:ends[n - 1]]


def config_keys(model: type[BaseModel] = ExGRPOConfig, prefix: str = "",
                defaults: BaseModel | None = None) -> list[KeyHelp]:
    """Every leaf key of the config tree under `model`, depth first, in declaration order. Defaults
    come from the default instance, so a section whose parent sets its values (e.g. one monitor's
    bounds) shows those, not the section class's own."""
    out: list[KeyHelp] = []
    defaults = model() if defaults is None else defaults
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if _is_section(field.annotation):
            out.extend(config_keys(field.annotation, f"{key}.", getattr(defaults, name)))
            continue
        default = getattr(defaults, name)
        out.append(KeyHelp(key, type_name(field.annotation), yaml_value(default),
                           first_sentence(field.description)))
    return out


def missing_help(model: type[BaseModel] = ExGRPOConfig, prefix: str = "") -> list[str]:
    """Keys (sections included) whose field has no docstring."""
    out = []
    for name, field in model.model_fields.items():
        if not first_sentence(field.description):
            out.append(f"{prefix}{name}")
        if _is_section(field.annotation):
            out.extend(missing_help(field.annotation, f"{prefix}{name}."))
    return out


def format_keys(prefix: str = "") -> str:
    """The `--help-keys [PREFIX]` listing: per key a line `key: type = default` and an indented help line."""
    keys = [k for k in config_keys() if k.key.startswith(prefix)]
    if not keys:
        sections = sorted({k.key.split(".")[0] for k in config_keys()})
        raise ConfigError(f"no config key starts with '{prefix}' (sections: {', '.join(sections)})")
    return "".join(f"{k.key}: {k.type} = {k.default}\n    {k.help}\n" for k in keys)
