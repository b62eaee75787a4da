"""One ``leaf study`` per output directory: an exclusive ``flock`` on
``<output_dir>/.study.lock``, held for the whole study and released by the kernel when
the process ends (kill -9 included), so a stale lock never blocks a resume."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from leaf_plugins.core.errors import ConfigError

__all__ = ["StudyLock", "LOCK"]

LOCK = ".study.lock"


class StudyLock:
    """``with StudyLock(output_dir): ...``; a second holder gets a ``ConfigError`` naming
    the process that holds the directory."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK
        self.handle = None

    def __enter__(self) -> "StudyLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(f"{self.path.parent} is in use by another `leaf study` ({holder}): wait for it to "
                              f"finish, stop it, or give this study another output_dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None
