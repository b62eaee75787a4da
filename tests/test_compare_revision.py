"""benchmarks/compare_revision.py: another revision's package imported beside the working tree's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "compare_revision.py"

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs git and this repository's history")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_head_against_the_working_tree_times_both_and_compares_their_advantages():
    """Both sides run and are timed; where the package is unchanged since HEAD their
    advantages are the same bit for bit."""
    result = run("HEAD", "tree_otb:tree_weight=1", "--size", "fixed-cost-2x2x8", "--rounds", "3", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert re.search(r"\| HEAD \| \d+\.\d\d \|", result.stdout)
    assert re.search(r"\| working tree \| \d+\.\d\d \|", result.stdout)
    ratio = re.search(r"per call: median (\d+\.\d+) \(95% interval (\d+\.\d+)–(\d+\.\d+)\)", result.stdout)
    assert ratio and float(ratio[2]) <= float(ratio[1]) <= float(ratio[3])
    difference = float(re.search(r"largest difference of the advantages: (\S+) of their size", result.stdout)[1])
    unchanged = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "leaf_plugins"], cwd=ROOT).returncode == 0
    if unchanged:
        assert difference == 0.0


def test_an_unknown_revision_or_estimator_is_named():
    assert "git archive no-such-revision" in run("no-such-revision", "grpo").stderr
    assert "Unknown estimator 'no_such'" in run("HEAD", "no_such", "--rounds", "2").stderr
