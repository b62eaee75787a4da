"""PNG figures of the credit benchmark."""

from __future__ import annotations

from pathlib import Path

from leaf_plugins.analysis.plots import pyplot
from leaf_plugins.bench.credit.sweep import Row

__all__ = ["plot_cosines", "plot_learning"]


def plot_cosines(rows: list[Row], path: Path) -> None:
    """Gradient cosine with 95% CI, one group of bars per regime."""
    plt = pyplot()
    regimes = list(dict.fromkeys(row.regime for row in rows))
    estimators = list(dict.fromkeys(row.estimator for row in rows))
    figure, axis = plt.subplots(figsize=(max(8, len(regimes) * 1.2), 4))
    width = 0.8 / len(estimators)
    for index, estimator in enumerate(estimators):
        chosen = [next(row for row in rows if row.regime == r and row.estimator == estimator) for r in regimes]
        axis.bar([i + index * width for i in range(len(regimes))], [row.cosine.mean for row in chosen], width,
                 yerr=[row.cosine.half_width for row in chosen], label=estimator, capsize=2)
    axis.set_xticks([i + width * (len(estimators) - 1) / 2 for i in range(len(regimes))], regimes, rotation=25,
                    ha="right", fontsize=8)
    axis.set_ylabel("cosine(estimated gradient, exact ∇J)")
    axis.set_title("Gradient quality per group of K samples")
    axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_learning(rows: list[Row], path: Path, protocol: str) -> None:
    """Mean exact reward J over policy-gradient steps under ``protocol``, one panel per
    regime."""
    plt = pyplot()
    regimes = list(dict.fromkeys(row.regime for row in rows))
    columns = min(5, len(regimes))
    lines = (len(regimes) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(3.2 * columns, 2.6 * lines), squeeze=False)
    for axis, regime in zip(axes.flat, regimes):
        for row in (row for row in rows if row.regime == regime):
            axis.plot(row.curves[protocol], label=row.estimator, linestyle="--" if row.estimator.startswith("oracle") else "-")
        axis.set_title(regime, fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(regimes):]:
        axis.axis("off")
    axes.flat[0].set_ylabel("exact E[r]", fontsize=8)
    axes.flat[0].legend(fontsize=6)
    figure.suptitle(f"exact E[r] while learning ({protocol} steps)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
