"""A real third-party plugin package, and a broken one, installed and used through the
entry-point group, in subprocesses so the test environment itself stays clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """Both example packages installed into a private directory."""
    target = tmp_path_factory.mktemp("site")
    for package in ("leaf-rloo", "leaf-broken"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
             "--disable-pip-version-check", "--target", str(target), str(EXAMPLES / package)],
            check=True,
        )
    return target


def run(plugin_path: Path, code: str, strict: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LEAF_PLUGINS_STRICT"}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_path), env.get("PYTHONPATH", "")])
    if strict:
        env["LEAF_PLUGINS_STRICT"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_plugins_lists_the_third_party_estimator_and_survives_the_broken_one(plugin_path):
    done = run(plugin_path, "from leaf_plugins.cli import main; raise SystemExit(main(['plugins']))")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:3] for line in done.stdout.splitlines()]
    assert ["estimator", "rloo", "leaf-rloo"] in rows
    for name in ("grpo", "leaf", "collision", "full_tree", "otb"):
        assert ["estimator", name, "leaf-plugins"] in rows
    assert "skipped plugin 'broken-estimator'" in done.stderr
    assert "this plugin is broken on purpose" in done.stderr


def test_third_party_estimator_runs_through_the_same_api(plugin_path):
    code = (
        "import leaf_plugins as lp\n"
        "b = lp.RolloutBatch.from_lists([[1, 2], [3], [4, 5, 6], [7]], [1.0, 0.0, 0.5, 0.9], [0, 0, 0, 1])\n"
        "print(lp.estimate(b, 'rloo').advantages.tolist())\n"
    )
    done = run(plugin_path, code)
    assert done.returncode == 0, done.stderr
    advantages = eval(done.stdout.strip())
    # r_i minus the mean of the other two rewards of group 0; group 1 has one response
    assert advantages[0][:2] == pytest.approx([1.0 - 0.25] * 2)
    assert advantages[1][0] == pytest.approx(0.0 - 0.75) and advantages[1][1:] == [0.0, 0.0]
    assert advantages[2] == pytest.approx([0.5 - 0.5] * 3)
    assert advantages[3] == [0.0, 0.0, 0.0]


def test_broken_plugin_is_fatal_in_strict_mode_and_named(plugin_path):
    done = run(plugin_path, "from leaf_plugins.cli import main; raise SystemExit(main(['plugins']))", strict=True)
    assert done.returncode != 0
    assert "plugin 'broken-estimator' failed to load" in done.stderr
