"""Check a command's ``written:`` line against the files it wrote."""

from __future__ import annotations

import os
from pathlib import Path

from leaf_plugins.cli import main

__all__ = ["run_naming_every_file_written"]


def run_naming_every_file_written(argv: list[str], directory: Path, capsys) -> str:
    """Run ``leaf`` with ``argv`` (it must succeed) and check that its ``written:`` line
    names exactly the files it wrote or rewrote under ``directory`` (hidden files, such as
    a study's lock, left out; text after a ``;`` on the line is a note, not a file).
    Return what the command printed."""
    for path in directory.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(0, 0))  # a file the command writes gets a newer time
    assert main(argv) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("written: ")]
    assert len(lines) == 1, printed
    named = {Path(name) for name in lines[0][len("written: "):].split("; ")[0].split(", ")}
    written = {path for path in directory.rglob("*")
               if path.is_file() and not path.name.startswith(".") and path.stat().st_mtime_ns != 0}
    assert named == written, (f"{' '.join(argv)}: its written: line leaves out {sorted(map(str, written - named))} "
                              f"and names {sorted(map(str, named - written))}, which it did not write")
    return printed
