"""The declared dependency range is the tested one: every lower bound in pyproject.toml is
pinned in constraints/floor.txt (what the floor environment of .ci/run installs), and the
environment running this test satisfies the declared range."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
UNPINNED = {"torch", "setuptools"}
"""Kept out of the floor constraints: torch stays at the local CPU build (docs/installation.md,
"Supported versions"), and torch 2.13 itself requires setuptools >= 77.0.3."""


def requirement_bounds(*extras: str) -> dict[str, str]:
    """``name -> lower bound`` of the dependencies of pyproject.toml and of ``extras``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    bounds = {}
    for line in lines:
        found = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9.]*)(,.*)?", line)
        assert found, f"pyproject.toml: {line!r} has no '>=' lower bound"
        bounds[found.group(1).lower()] = found.group(2)
    return bounds


def floor_pins() -> dict[str, str]:
    """``name -> version`` pinned in constraints/floor.txt."""
    pins = {}
    for line in (ROOT / "constraints" / "floor.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, pinned = line.split("==")
            pins[name.strip().lower()] = pinned.strip()
    return pins


def release(text: str) -> tuple[int, ...]:
    """``(2, 13, 0)`` of ``"2.13.0+cpu"``."""
    return tuple(int(part) for part in re.match(r"[0-9.]*[0-9]", text).group(0).split("."))


def test_every_declared_lower_bound_is_pinned_in_the_floor_constraints():
    # the [trl] extra is not in the floor environment (TRL 1.16 needs accelerate >= 1.10.1):
    # its floor is the version scripts/install.sh installs, tested by the whole suite; the
    # [verl] extra is tested in verl's own environment (tests/test_verl_install.py)
    bounds = requirement_bounds("train", "test")
    assert floor_pins() == {name: bound for name, bound in bounds.items() if name not in UNPINNED}


def test_this_environment_is_inside_the_declared_range():
    for name, bound in requirement_bounds("train", "test").items():
        assert release(version(name)) >= release(bound), f"{name} {version(name)} is below the declared {bound}"
