"""What every config section shares: unknown keys refused, assignments validated, docstrings kept as help."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config file, preset name or override that cannot be used; the message names the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", validate_assignment=True)
