"""The figure of ``leaf runs plot``: metrics against the training step, one panel per
metric, one line per run, drawn at the 800 px wide it is read at (matplotlib, Agg
backend)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

from leaf_plugins.analysis.plots import pyplot

__all__ = ["plot_runs", "default_plot_path", "WIDTH_INCHES", "DPI"]

WIDTH_INCHES = 8.0
DPI = 100  # 800 px wide: no downscaling of its text where it is read
PANEL_INCHES = 2.8  # the height of one metric's panel
MARKED_POINTS = 40  # lines of at most this many steps mark each step (a one-step run is a dot, not nothing)


def default_plot_path(metrics: Sequence[str]) -> Path:
    """``runs-<metric>[-<metric>...].png`` in the current directory, each name made safe
    for a file name (``reward/sentence_bleu`` -> ``reward_sentence_bleu``)."""
    return Path("runs-" + "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", metric) for metric in metrics) + ".png")


def plot_runs(curves: Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]], path: Path) -> Path:
    """Write the PNG of ``curves`` (metric -> run name -> ``(steps, values)``) to ``path``:
    one panel per metric, stacked, each with a line per run, its legend and labelled axes.
    Returns ``path``."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    figure, axes = plt.subplots(len(curves), 1, squeeze=False, sharex=True,
                                figsize=(WIDTH_INCHES, 0.6 + PANEL_INCHES * len(curves)))
    for axis, (metric, runs) in zip(axes[:, 0], curves.items()):
        for name, (steps, values) in runs.items():
            marker = "o" if len(steps) <= MARKED_POINTS else None
            axis.plot(steps, values, label=name, linewidth=1.4, marker=marker, markersize=3)
        axis.set_title(f"{metric} per training step", fontsize=10)
        axis.set_ylabel(metric, fontsize=9)
        axis.tick_params(labelsize=8)
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=8)
    axes[-1, 0].set_xlabel("training step", fontsize=9)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png")
    plt.close(figure)
    return path
