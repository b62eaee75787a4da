"""Figures are drawn to be read at 800 px wide: the credit benchmark's on a grid of panels
and ``leaf runs plot``'s a panel per metric (never a strip wider than 3:1), and every PNG
the docs show keeps that shape."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from leaf_plugins.bench.credit.plots import plot_cosines, plot_learning, reward_family
from leaf_plugins.training.run_curves import plot_runs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` from the PNG header (IHDR is the first chunk)."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", header[16:24])


def credit_rows(regimes: list[str], estimators: list[str]) -> list[SimpleNamespace]:
    """Rows shaped like the credit sweep's, with distinct values per regime and estimator."""
    return [SimpleNamespace(regime=regime, estimator=estimator,
                            cosine=SimpleNamespace(mean=0.1 + 0.01 * r + 0.02 * e, half_width=0.01),
                            curves={"adam": [0.5 + 0.01 * step * (1 + e) for step in range(31)]})
            for r, regime in enumerate(regimes) for e, estimator in enumerate(estimators)]


REGIMES = ["base", "K=4", "graded", "graded K=16", "exact match", "exact match, length decision K=16", "B=1"]
ESTIMATORS = ["grpo", "leaf", "collision", "full_tree", "otb", "tree_rloo", "tree_otb", "oracle (true Q-V)"]


def test_reward_families_follow_the_regime_names():
    assert [reward_family(name) for name in REGIMES] == [
        "additive reward", "additive reward", "graded reward", "graded reward",
        "exact-match reward", "exact-match reward", "additive reward"]


@pytest.mark.parametrize("regimes", [REGIMES, REGIMES * 4], ids=["7 regimes", "28 regimes"])
def test_the_credit_figures_are_800_px_wide_and_never_a_wide_strip(regimes, tmp_path):
    regimes = [f"{name} #{index}" for index, name in enumerate(regimes)]
    rows = credit_rows(regimes, ESTIMATORS)
    plot_cosines(rows, tmp_path / "cosine.png")
    plot_learning(rows, tmp_path / "learning.png", "adam")
    for name in ("cosine.png", "learning.png"):
        width, height = png_size(tmp_path / name)
        assert width == 800, name  # drawn at the width it is read at: no downscaling of its text
        assert width <= 3 * height, (name, width, height)


@pytest.mark.parametrize("metrics", [1, 4], ids=["one metric", "four metrics"])
def test_the_runs_plot_is_800_px_wide_and_never_a_wide_strip(metrics, tmp_path):
    curves = {f"reward/part_{m}": {f"seed-{r}": (list(range(1, 31)), [0.01 * step + r for step in range(1, 31)])
                                   for r in range(3)} for m in range(metrics)}
    width, height = png_size(plot_runs(curves, tmp_path / "runs.png"))
    assert width == 800  # drawn at the width it is read at
    assert width <= 3 * height, (width, height)


def test_every_png_in_the_docs_is_readable_at_800_px():
    pictures = sorted(DOCS.rglob("*.png"))
    assert pictures
    for picture in pictures:
        width, height = png_size(picture)
        # wider than 3:1 shrinks its text below legibility at 800 px; under 600 px wide it is upscaled blurry
        assert width <= 3 * height and width >= 600, (picture.name, width, height)
