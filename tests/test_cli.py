"""The ``leaf`` console script itself: its version, and overrides given after an option."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from leaf_plugins.cli import main
from leaf_plugins.core import version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11, to read pyproject.toml independently of the fallback

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"leaf-plugins {metadata.version('leaf-plugins')}\n"


def test_version_from_a_source_tree_that_is_not_installed_is_pyprojects(monkeypatch):
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", missing)
    expected = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert version.package_version() == f"{expected} (source tree, not installed)"
    assert re.fullmatch(r"\d+\.\d+\.\d+", expected)


def test_overrides_may_follow_an_option(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text("output_dir: out\nbase: {steps: 3}\ngrid: {estimator.name: [grpo, leaf]}\n")
    assert main(["study", str(path), "--check", "seeds=[0,1,2]"]) == 0
    assert "6 runs (2 variations x 3 seeds)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["study", str(path), "--check", "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
