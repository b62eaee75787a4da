"""The package's version: from its installed metadata, or from the source tree's
``pyproject.toml`` when the package runs from a checkout that is not installed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

__all__ = ["package_version", "DISTRIBUTION"]

DISTRIBUTION = "leaf-plugins"


def package_version() -> str:
    """``0.1.0`` from the installed distribution's metadata; from a checkout that is not
    installed, the ``version`` of its ``pyproject.toml`` and ``(source tree)``; else
    ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        return "unknown (not installed, and no pyproject.toml beside the package)"
    project = re.search(r'^\[project\]\s*$(.*?)(?=^\[|\Z)', text, re.M | re.S)
    found = re.search(r'^version\s*=\s*"([^"]+)"', project[1], re.M) if project else None
    return f"{found[1]} (source tree, not installed)" if found else "unknown (source tree, not installed)"
