"""YAML configuration files into typed dataclasses, with every mistake reported at once.

Each error names ``file:line:col``, the key and, where it can, the closest valid key or
registered name. Command-line overrides ``a.b=value`` are applied before validation and
reported by their text when they are wrong.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.reader import ReaderError

from leaf_plugins.core.errors import ConfigError, suggest

__all__ = ["load_yaml", "load_config", "apply_overrides", "build", "build_collecting", "set_dotted", "format_errors",
           "key_location"]


def load_yaml(path: Path) -> CommentedMap:
    """The file as a round-trip mapping (which keeps line and column of every key)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line, column = _line_column(raw[: error.start].decode("utf-8", "replace"), error.start)
        raise ConfigError(f"{path}:{line}:{column}: not UTF-8 text (byte {raw[error.start]:#04x})") from None
    try:
        data = YAML(typ="rt").load(text)
    except MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else "1:1"
        raise ConfigError(f"{path}:{where}: YAML syntax error: {error.problem or error.context}") from None
    except ReaderError as error:  # a character YAML does not allow (control characters)
        line, column = _line_column(text, error.position)
        raise ConfigError(f"{path}:{line}:{column}: character {error.character:#x} is not allowed in YAML") from None
    if data is None:
        return CommentedMap()
    if not isinstance(data, CommentedMap):
        raise ConfigError(f"{path}:1:1: the file must hold a mapping of sections, not a {type(data).__name__}")
    return data


def _line_column(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index`` of ``text``."""
    before = text[:index]
    return before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1


def load_config(
    cls: type, path: Path, overrides: Iterable[str] = (),
    validators: dict[str, Callable[[Any], str | None]] | None = None,
) -> Any:
    """An instance of dataclass ``cls`` from the YAML file ``path`` and ``a.b=value``
    overrides; every error raised together."""
    data = load_yaml(path)
    errors = apply_overrides(data, overrides)
    if errors:
        raise ConfigError(f"{path}: " + "; ".join(errors))
    return build(cls, data, str(path), validators)


def apply_overrides(data: CommentedMap, overrides: Iterable[str]) -> list[str]:
    """Set ``a.b=value`` overrides (values parsed as YAML scalars); return the errors."""
    errors = []
    for text in overrides:
        key, separator, raw = text.partition("=")
        if not separator or not key:
            errors.append(f"override {text!r}: expected key.path=value")
            continue
        value = YAML(typ="safe").load(raw) if raw.strip() else None
        problem = set_dotted(data, key, value, f"override {text!r}")
        if problem:
            errors.append(f"override {text!r}: {problem}")
    return errors


def set_dotted(data: CommentedMap, key: str, value: Any, source: str) -> str | None:
    """Set ``data[a][b] = value`` for ``key`` ``"a.b"``, creating sections; errors in the
    built configuration at this key are then reported at ``source``. Returns the
    problem, if a part of the path is not a section."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = CommentedMap()
            node[part] = child
        if not isinstance(child, dict):
            return f"{part!r} is not a section"
        node = child
    node[parts[-1]] = value
    _mark_location(node, parts[-1], source)
    return None


def build(
    cls: type, data: Any, where: str, validators: dict[str, Callable[[Any], str | None]] | None = None,
    prefix: str = "",
) -> Any:
    """An instance of dataclass ``cls`` from ``data``; every error raised together.

    :param where: the file name, for locations.
    :param validators: dotted key -> function returning an error message (or None),
        e.g. to check that an estimator name is registered.
    :param prefix: the dotted path of ``data`` in its file (``"base."``), for messages.
    """
    value, errors = build_collecting(cls, data, where, validators, prefix)
    if errors:
        raise ConfigError(format_errors(where, errors))
    return value


def build_collecting(
    cls: type, data: Any, where: str, validators: dict[str, Callable[[Any], str | None]] | None = None,
    prefix: str = "",
) -> tuple[Any, list[str]]:
    """Like ``build``, but the errors are returned (with the instance built from the
    valid keys) so that a caller can report them together with its own."""
    errors: list[str] = []
    value = _build(cls, data, where, prefix, errors, validators or {})
    return value, errors


def format_errors(where: str, errors: list[str]) -> str:
    """One message for all ``errors`` of the file ``where`` (duplicates dropped)."""
    unique = list(dict.fromkeys(errors))
    count = f"{len(unique)} error{'s' if len(unique) > 1 else ''}"
    return f"{where}: {count} in the configuration:\n  " + "\n  ".join(unique)


def _build(cls: type, data: Any, where: str, prefix: str, errors: list[str], validators: dict) -> Any:
    if data is None:
        data = CommentedMap()
    if not isinstance(data, dict):
        errors.append(f"{where}: {prefix or 'the file'} must be a mapping, got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key in data:
        here = key_location(data, key, where)
        path = f"{prefix}{key}"
        if key not in fields:
            errors.append(f"{here}: unknown key {path!r}.{suggest(str(key), fields)} Valid keys: {', '.join(fields)}")
            continue
        expected = hints[key]
        raw = data[key]
        if dataclasses.is_dataclass(expected):
            if raw is not None and not isinstance(raw, dict):
                errors.append(f"{here}: {path}: expected a section (a mapping of keys), got {raw!r}")
                continue
            values[key] = _build(expected, raw, where, path + ".", errors, validators)
            continue
        problem = _type_problem(raw, expected)
        if problem:
            errors.append(f"{here}: {path}: {problem}")
            continue
        value = dict(raw) if isinstance(raw, dict) else raw
        check = validators.get(path)
        message = check(value) if check else None
        if message:
            errors.append(f"{here}: {path}: {message}")
            continue
        values[key] = value
    return cls(**values)


def _type_problem(value: Any, expected: Any) -> str | None:
    """Why ``value`` does not fit the annotation ``expected`` (None if it does)."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if any(_type_problem(value, option) is None for option in options):
            return None
        return f"expected {_name(expected)}, got {value!r}"
    if expected is type(None):
        return None if value is None else "expected nothing (null)"
    if expected is Any:
        return None
    base = origin or expected
    if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    if base is int and isinstance(value, bool):
        return f"expected {_name(expected)}, got {value!r}"
    if isinstance(value, base):
        return None
    return f"expected {_name(expected)}, got {value!r}"


def _name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(annotation))
    origin = typing.get_origin(annotation)
    if origin is not None:
        return origin.__name__
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


_LOCATIONS = "_leaf_locations"


def _mark_location(node: Any, key: str, source: str) -> None:
    marks = getattr(node, _LOCATIONS, None)
    if marks is None:
        marks = {}
        try:
            setattr(node, _LOCATIONS, marks)
        except AttributeError:
            return
    marks[key] = source


def key_location(node: Any, key: Any, where: str) -> str:
    """Where ``key`` of the mapping ``node`` was given: ``file:line:col`` in the file
    ``where``, or the override (or other marked source) that set it."""
    marks = getattr(node, _LOCATIONS, {})
    if key in marks:
        return marks[key]
    try:
        line, column = node.lc.key(key)
        return f"{where}:{line + 1}:{column + 1}"
    except (AttributeError, KeyError, TypeError):
        return where
