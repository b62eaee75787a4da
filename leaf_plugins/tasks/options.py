"""Declared load options of a task: types, defaults, did-you-mean for unknown names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leaf_plugins.core.errors import ConfigError, suggest

__all__ = ["Option", "parse_options"]


@dataclass(frozen=True)
class Option:
    """One load option. ``kind``: ``"path"``, ``"paths"`` (comma-separated or a list),
    ``"str"``, ``"float"``, ``"int"``."""

    name: str
    kind: str
    default: Any
    help: str


def parse_options(task: str, declared: tuple[Option, ...], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (strings from the command line or typed values from YAML) converted to
    the declared kinds, with defaults; unknown names and bad values are one error."""
    known = {option.name: option for option in declared}
    errors = []
    for name in given:
        if name not in known:
            errors.append(f"unknown option {name!r}.{suggest(name, known)} Options: {', '.join(known)}")
    values = {}
    for option in declared:
        value = given.get(option.name, option.default)
        try:
            values[option.name] = None if value is None else _convert(option.kind, value)
        except (TypeError, ValueError):
            errors.append(f"option {option.name!r} must be {option.kind}, got {value!r}")
    if errors:
        raise ConfigError(f"task {task!r}: " + "; ".join(errors))
    return values


def _convert(kind: str, value: Any) -> Any:
    if kind == "path":
        return Path(str(value)).expanduser()
    if kind == "paths":
        items = value.split(",") if isinstance(value, str) else list(value)
        return [Path(str(item).strip()).expanduser() for item in items if str(item).strip()]
    if kind == "float":
        return float(value)
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return int(value)
    return str(value)
