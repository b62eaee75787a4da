"""YAML configuration files into typed dataclasses, with every mistake reported at once.

Each error names ``file:line:col``, the key and, where it can, the closest valid key or
registered name. Command-line overrides ``a.b=value`` are applied before validation and
reported by their text when they are wrong.

A mapping may name other files to fill in what it leaves unset (``include:``, a file or
a list of files, relative to the including file): a run config includes a recipe of
``configs/recipes/``, a study's ``base`` does the same. What the mapping sets itself
wins, then the later of its includes; a section set in both is merged key by key, a
list is taken whole. An error in an included value names the included file's line.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.reader import ReaderError

from leaf_plugins.core.errors import ConfigError, suggest

__all__ = ["Setting", "INCLUDE", "load_yaml", "resolve_includes", "load_config", "parse_overrides", "apply_settings", "apply_overrides", "build",
           "build_collecting", "set_dotted", "format_errors", "key_location", "differing_settings"]

Setting = tuple[str, Any, str]  # (dotted key, value, where it was given: "override 'a.b=1'" or file:line:col)

INCLUDE = "include"
"""The key of a mapping that names the files filling in what it leaves unset."""


def load_yaml(path: Path) -> CommentedMap:
    """The file as a round-trip mapping (which keeps line and column of every key)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a YAML file") from None
    except OSError as error:  # permission denied, a device that cannot be read
        raise ConfigError(f"{path}: cannot be read: {error.strerror or error}") from None
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
        line, column = (data.lc.line + 1, data.lc.col + 1) if isinstance(data, list) else (1, 1)
        raise ConfigError(f"{path}:{line}:{column}: the file must hold a mapping of sections (`key: value` lines), "
                          f"not {_kind(data)}")
    return data


def resolve_includes(node: CommentedMap, path: Path, chain: tuple[Path, ...] = ()) -> None:
    """Fill in the keys ``node`` (a mapping of the file ``path``) leaves unset from the
    files its ``include:`` names, then drop the key (the module's rules). Raises
    ``ConfigError`` at the ``include`` key for a file that is missing, unreadable or
    includes itself."""
    if not isinstance(node, CommentedMap) or INCLUDE not in node:
        return
    path = Path(path)
    at = key_location(node, INCLUDE, str(path))
    value = node[INCLUDE]
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"{at}: include must name a file or a list of files, got {value!r}")
    del node[INCLUDE]
    here = (*chain, path.resolve())
    for name in reversed(names):  # the later include wins: it fills first
        target = path.parent / name
        if target.resolve() in here:
            cycle = " -> ".join(str(step) for step in (*here, target.resolve()))
            raise ConfigError(f"{at}: include {name!r} includes itself ({cycle})")
        if not target.is_file():
            raise ConfigError(f"{at}: include {name!r}: no such file ({target})")
        included = load_yaml(target)
        resolve_includes(included, target, here)
        _locate_keys(included, str(target))
        _fill_unset(node, included)


def _locate_keys(node: Any, where: str) -> None:
    """Mark every key of ``node`` (and of its sections and list entries) with its place
    in the file ``where``, keeping places marked already."""
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            if key not in _marks(node):
                _mark_location(node, key, key_location(node, key, where))
            _locate_keys(value, where)
    elif isinstance(node, list):
        for value in node:
            _locate_keys(value, where)


def _fill_unset(node: CommentedMap, included: CommentedMap) -> None:
    """Set the keys of ``included`` that ``node`` lacks (sections merged key by key)."""
    for key, value in included.items():
        if key not in node:
            node[key] = value
            _mark_location(node, key, key_location(included, key, ""))
        elif isinstance(node[key], CommentedMap) and isinstance(value, CommentedMap):
            _fill_unset(node[key], value)


def _kind(value: Any) -> str:
    """What a YAML value is, in the words of the file (``a list``, ``a single value 3``)."""
    if isinstance(value, list):
        return "a list"
    return f"a single value {value!r}"


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


def parse_overrides(overrides: Iterable[str]) -> tuple[list[Setting], list[str]]:
    """``a.b=value`` overrides as settings ``(key, value, "override 'a.b=value'")``
    (values parsed as YAML scalars or flow collections), and the errors of those that
    are not ``key=value`` or whose value is not YAML."""
    settings, errors = [], []
    for text in overrides:
        key, separator, raw = text.partition("=")
        source = f"override {text!r}"
        if not separator or not key:
            errors.append(f"{source}: expected key.path=value")
            continue
        try:
            value = YAML(typ="safe").load(raw) if raw.strip() else None
        except (MarkedYAMLError, ReaderError) as error:
            errors.append(f"{source}: the value is not YAML: {getattr(error, 'problem', None) or error}")
            continue
        settings.append((key, value, source))
    return settings, errors


def apply_settings(data: CommentedMap, settings: Iterable[Setting]) -> list[str]:
    """Set every ``(key, value, source)``; return the errors (named by their source)."""
    errors = []
    for key, value, source in settings:
        problem = set_dotted(data, key, value, source)
        if problem:
            errors.append(f"{source}: {problem}")
    return errors


def apply_overrides(data: CommentedMap, overrides: Iterable[str]) -> list[str]:
    """Set ``a.b=value`` overrides (values parsed as YAML scalars); return the errors."""
    settings, errors = parse_overrides(overrides)
    return errors + apply_settings(data, settings)


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
    """One message for all ``errors`` of the file ``where`` (duplicates dropped): those
    named by an override or another file first, in their order, then the file's own
    in line order."""
    unique = sorted(dict.fromkeys(errors), key=lambda error: _line_order(where, error))
    count = f"{len(unique)} error{'s' if len(unique) > 1 else ''}"
    return f"{where}: {count} in the configuration:\n  " + "\n  ".join(unique)


def _line_order(where: str, error: str) -> tuple[int, int, int]:
    """``(0, 0, 0)`` for an error not located in ``where``, else ``(1, line, column)``."""
    found = re.match(rf"{re.escape(where)}:(\d+):(\d+)", error)
    return (1, int(found[1]), int(found[2])) if found else (0, 0, 0)


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


def _marks(node: Any) -> dict[Any, str]:
    """The places marked on the mapping ``node`` (kept in its line-and-column record, so
    that a deep copy keeps them)."""
    record = getattr(node, "lc", None)
    return getattr(record, _LOCATIONS, {}) if record is not None else {}


def _mark_location(node: Any, key: str, source: str) -> None:
    record = getattr(node, "lc", None)
    if record is None:  # a plain mapping (an override's value): its errors name the override
        return
    marks = getattr(record, _LOCATIONS, None)
    if marks is None:
        marks = {}
        setattr(record, _LOCATIONS, marks)
    marks[key] = source


def key_location(node: Any, key: Any, where: str) -> str:
    """Where ``key`` of the mapping ``node`` was given: ``file:line:col`` in the file
    ``where``, or the override, included file (or other marked source) that set it."""
    marks = _marks(node)
    if key in marks:
        return marks[key]
    try:
        line, column = node.lc.key(key)
        return f"{where}:{line + 1}:{column + 1}"
    except (AttributeError, KeyError, TypeError):
        return where


def differing_settings(held: Any, wanted: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, held value, wanted value)`` for every leaf where two nested settings
    mappings differ, in sorted key order; a key missing on one side counts as None there."""
    if isinstance(held, dict) and isinstance(wanted, dict):
        found = []
        for key in sorted(set(held) | set(wanted), key=str):
            found += differing_settings(held.get(key), wanted.get(key), f"{prefix}{key}.")
        return found
    return [] if held == wanted else [(prefix.rstrip("."), held, wanted)]
