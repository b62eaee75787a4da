"""``status.json`` in a run's directory: where the run stands, for ``leaf runs``.

The main process writes it when the run starts training (``running``) and when it
stops: ``finished`` (every step trained), ``interrupted`` (Ctrl-C, SIGTERM: resumable)
or ``failed`` (an error, named). A run killed outright (``kill -9``, a lost node) leaves
``running`` with a process id that no longer runs: ``leaf runs`` calls it ``stopped``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from leaf_plugins.training.durable import replace_text

__all__ = ["RUN_STATUS", "RunStatus", "write_status", "read_status", "STATES"]

RUN_STATUS = "status.json"
STATES = ("running", "finished", "interrupted", "failed")


@dataclass(frozen=True)
class RunStatus:
    """A run's state when it was written."""

    state: str  # one of STATES
    step: int  # steps trained (logged)
    steps: int  # steps planned
    message: str = ""  # what stopped it (the signal, the error)
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))


def write_status(output_dir: Path, status: RunStatus) -> None:
    """Write ``status`` to the run directory's ``status.json`` (atomically)."""
    replace_text(Path(output_dir) / RUN_STATUS, json.dumps(asdict(status), indent=1))


def read_status(output_dir: Path) -> RunStatus | None:
    """The run directory's status (None: it has none, or it cannot be read)."""
    path = Path(output_dir) / RUN_STATUS
    try:
        return RunStatus(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
