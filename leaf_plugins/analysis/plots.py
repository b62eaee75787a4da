"""PNG plots of the forkability analysis (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["plot_usable_rate", "pyplot"]


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend (files only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_usable_rate(
    curves: Mapping[str, Sequence[dict]],
    path: str | Path,
    min_attempts: int = 15,
    max_position: int | None = None,
) -> Path:
    """Usable fork-fire rate vs token position, one line per label, with its pointwise
    Wilson 95% band. Positions with fewer than ``min_attempts`` attempts are dropped (the
    paper uses 15); ``max_position`` clips the x axis.

    :param curves: label → rows of ``ForkabilityReport.per_position()``.
    """
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    for label, rows in curves.items():
        kept = [row for row in rows if row["attempts"] >= min_attempts
                and (max_position is None or row["position"] <= max_position)]
        if not kept:
            continue
        x = [row["position"] for row in kept]
        line, = axis.plot(x, [100 * row["rate"] for row in kept], marker=".", label=label)
        axis.fill_between(x, [100 * row["wilson_low"] for row in kept], [100 * row["wilson_high"] for row in kept],
                          color=line.get_color(), alpha=0.2)
    axis.set_xlabel("token position of the boundary")
    axis.set_ylabel("usable fork-fire rate (%)")
    axis.set_ylim(0, 100)
    axis.set_title(f"Usable fork-fire rate (95% Wilson CI; positions with < {min_attempts} attempts dropped)",
                   fontsize=9)
    if axis.lines:
        axis.legend(fontsize=8)
    else:
        axis.text(0.5, 0.5, f"no position has {min_attempts} or more attempts", ha="center", va="center",
                  transform=axis.transAxes)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
