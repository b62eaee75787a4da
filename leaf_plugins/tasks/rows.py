"""Reading metadata rows (JSON arrays, JSON lines, TSV) with locations for error messages."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

from leaf_plugins.tasks.errors import DataError

__all__ = ["json_rows", "tsv_rows", "field", "optional_number"]


def json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each row of a JSON array file or a JSON-lines file;
    ``where`` is ``"file row i"`` (0-based array index) or ``"file line n"``."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
        for index, row in enumerate(data):
            yield f"{path} row {index}", row
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: invalid JSON line ({error.msg}); expected a JSON array "
                            "or one JSON object per line") from None
        yield f"{path} line {number}", row


def tsv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str]]]:
    """``("file:line", row)`` for each data line of a tab-separated file with a header
    (Common Voice / CoVoST quoting: none, backslash escapes). Missing columns and lines
    with the wrong number of fields are errors."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        header = next(reader, None) or []
        missing = [name for name in required if name not in header]
        if missing:
            raise DataError(f"{path}:1: missing column(s) {', '.join(map(repr, missing))}; "
                            f"header has: {', '.join(header) or '(empty)'}")
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise DataError(f"{path}:{reader.line_num}: expected {len(header)} tab-separated fields "
                                f"({', '.join(header)}), found {len(fields)}")
            yield f"{path}:{reader.line_num}", dict(zip(header, fields))


def field(where: str, row: Any, key: str) -> str:
    """The non-empty string ``row[key]``; otherwise an error naming ``where`` and ``key``."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with key {key!r}, found {type(row).__name__}")
    if key not in row:
        raise DataError(f"{where}: missing key {key!r} (keys: {', '.join(map(str, row)) or 'none'})")
    value = row[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "id":
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: key {key!r} must be a non-empty string, found {value!r}")
    return value


def optional_number(where: str, row: dict[str, Any], key: str) -> float | None:
    """``row[key]`` as a float if present (a number or a numeric string), else ``None``."""
    value = row.get(key)
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: key {key!r} must be a number, found {value!r}") from None
