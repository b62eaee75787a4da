"""``leaf checkpoints RUN_DIR ...``: one line per training run directory: the steps of its
checkpoints, the newest one, and the plugins its run config named (from ``plugins.json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

from leaf_plugins import ConfigError, hookimpl
from leaf_plugins.core.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options: here only the run directories."""
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="output directories of `leaf train`")


def summary(run: Path) -> tuple[str, str, str, str]:
    """The row of one run directory: the run, its checkpoints' steps, the newest
    checkpoint, and the plugins the run names now (``-`` for none)."""
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run}: no config.yaml (not a leaf train output directory)")
    checkpoints = sorted(path.name for path in run.glob("checkpoint-*")
                         if path.is_dir() and path.name.removeprefix("checkpoint-").isdigit())
    steps = ",".join(str(int(name.split("-")[1])) for name in checkpoints) or "-"
    record = run / "plugins.json"
    plugins = json.loads(record.read_text())[-1]["plugins"] if record.is_file() else []
    named = ",".join(f"{p['name']}=={p['version']}" if p["version"] else p["name"] for p in plugins) or "-"
    return str(run), steps, checkpoints[-1] if checkpoints else "-", named


def run(args: argparse.Namespace) -> int:
    """Print a row per run directory; the exit status."""
    rows = [("run", "checkpoints", "newest", "plugins"), *(summary(path) for path in args.runs)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


@hookimpl
def register_commands(register: Callable[[str, Command], None]) -> None:
    """Add ``leaf checkpoints``."""
    register("checkpoints", Command("List training runs' checkpoints (steps, newest) and the plugins they name.",
                                    add_arguments, run))
