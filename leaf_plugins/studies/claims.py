"""A directory holds the output of one configuration: a JSON record of its settings is
written on first use, and any later use with other settings is an error naming the
settings that differ (never a silent reuse)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from leaf_plugins.core.config import differing_settings
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.training.durable import replace_text

__all__ = ["claim", "differences"]


def claim(directory: Path, record: str, settings: Any, what: str) -> None:
    """Check that ``directory`` holds ``what`` (``"a run"``) made with ``settings`` (a
    JSON-able value, non-JSON leaves turned into strings) and record them there when it
    is new (written whole and renamed into place, so a reader never sees half of it). A
    directory with files but no ``record`` is an error too (hidden files, such as a lock,
    do not count)."""
    wanted = json.loads(json.dumps(settings, default=str))
    path = Path(directory) / record
    if path.exists():
        held = json.loads(path.read_text())
        if held != wanted:
            changed = sorted(differences(held, wanted))
            raise ConfigError(f"{directory} holds {what} with other settings ({', '.join(changed)}): delete it "
                              f"or give the study another output_dir")
    elif Path(directory).exists() and any(not p.name.startswith(".") for p in Path(directory).iterdir()):
        raise ConfigError(f"{directory} holds files of {what} with unknown settings (no {record}): delete it "
                          f"or give the study another output_dir")
    else:
        Path(directory).mkdir(parents=True, exist_ok=True)
        replace_text(path, json.dumps(wanted, indent=1))


def differences(held: dict, wanted: dict) -> list[str]:
    """``"a.b: old -> new"`` for every dotted key whose value differs."""
    return [f"{key}: {old!r} -> {new!r}" for key, old, new in differing_settings(held, wanted)]
