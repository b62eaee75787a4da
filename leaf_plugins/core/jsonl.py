"""Reading JSONL files line by line with errors that name ``file:line``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from leaf_plugins.core.errors import ConfigError

__all__ = ["read_jsonl"]


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` for every non-blank line of ``path``; a missing file or
    a line that is not JSON is a ``ConfigError`` naming ``what`` the file is (``"rollout
    log"``) or the line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{what} {path} does not exist")
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from error
            yield number, record
