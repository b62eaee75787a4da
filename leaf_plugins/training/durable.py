"""Writes that survive a kill at any instant: files and directories fsynced before an
atomic rename, and logs cut back by writing a new file (never rewritten in place)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Callable

from leaf_plugins.core.errors import ConfigError

__all__ = ["fsync_tree", "fsync_directory", "replace_text", "truncate_log", "TornLineWarning"]


class TornLineWarning(UserWarning):
    """A log's last line was cut short by a kill mid-write and is dropped."""


def fsync_directory(path: Path) -> None:
    """Flush a directory's entries (new, renamed or removed names) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then every directory (deepest first), to disk."""
    directories = [root]
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            directories.append(path)
        else:
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for directory in reversed(directories):
        fsync_directory(directory)


def replace_text(path: Path, text: str) -> None:
    """Give ``path`` the content ``text`` atomically: a temporary file beside it is
    written and fsynced, then renamed over it; a kill leaves the old or the new file."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with temporary.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:  # an error or Ctrl-C before the rename: the old file stays, the copy goes
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def truncate_log(path: Path, keep: Callable[[dict], bool]) -> int:
    """Cut the JSONL log ``path`` back to the records ``keep`` accepts, atomically
    (``replace_text``). A torn last line (text after the last newline: a kill mid-write)
    is dropped with a ``TornLineWarning``; a complete line that is not JSON is a
    ``ConfigError`` naming ``file:line``. Returns the number of lines kept; a missing
    file stays missing."""
    if not path.exists():
        return 0
    *complete, tail = path.read_text().split("\n")  # a whole file ends with "\n": tail is ""
    kept = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from error
        if keep(record):
            kept.append(line)
    if tail.strip():
        warnings.warn(f"{path}:{len(complete) + 1}: dropped a torn last line (a write cut short by a kill)",
                      TornLineWarning, stacklevel=2)
    replace_text(path, "".join(line + "\n" for line in kept))
    return len(kept)
