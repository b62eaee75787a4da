"""PNG figures of the credit benchmark, laid out to be read at 800 px wide: one panel per
reward family (gradient cosine) or per regime (learning curves) on a grid, axes labelled
with their units, one legend for the figure."""

from __future__ import annotations

from pathlib import Path

from leaf_plugins.analysis.plots import pyplot
from leaf_plugins.bench.credit.sweep import Row

__all__ = ["plot_cosines", "plot_learning", "reward_family", "WIDTH_INCHES", "DPI"]

WIDTH_INCHES = 8.0
DPI = 100  # 800 px wide: the figure is drawn at the width it is read at
COLUMNS = 3  # learning-curve panels per line (about 250 px each)


def reward_family(regime: str) -> str:
    """The reward family a regime's name states: exact match, graded or additive."""
    if "exact match" in regime:
        return "exact-match reward"
    if "graded" in regime:
        return "graded reward"
    return "additive reward"


def plot_cosines(rows: list[Row], path: Path) -> None:
    """Paired per-group gradient cosine with its 95% CI: one panel per reward family, a line
    per regime, a marker per estimator."""
    plt = pyplot()
    regimes = list(dict.fromkeys(row.regime for row in rows))
    estimators = list(dict.fromkeys(row.estimator for row in rows))
    families = list(dict.fromkeys(reward_family(regime) for regime in regimes))
    by_family = {family: [regime for regime in regimes if reward_family(regime) == family] for family in families}
    row_height = 0.18 + 0.03 * len(estimators)  # inches per regime: room for every estimator's marker
    figure, axes = plt.subplots(
        len(families), 1, squeeze=False, sharex=True,
        figsize=(WIDTH_INCHES, 1.5 + sum(row_height * len(names) + 0.45 for names in by_family.values())),
        gridspec_kw={"height_ratios": [len(names) for names in by_family.values()]},
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    offsets = [(index - (len(estimators) - 1) / 2) * 0.8 / len(estimators) for index in range(len(estimators))]
    for axis, family in zip(axes[:, 0], families):
        names = by_family[family]
        for index, estimator in enumerate(estimators):
            chosen = [next((row for row in rows if row.regime == regime and row.estimator == estimator), None)
                      for regime in names]
            points = [(position, row) for position, row in enumerate(chosen) if row is not None]
            axis.errorbar([row.cosine.mean for _, row in points], [position + offsets[index] for position, _ in points],
                          xerr=[row.cosine.half_width for _, row in points], fmt="o", markersize=3.5, capsize=2,
                          linewidth=1, color=colours[index % len(colours)], label=estimator)
        axis.set_yticks(range(len(names)), names, fontsize=8)
        axis.set_ylim(len(names) - 0.5, -0.5)  # first regime on top
        axis.grid(axis="x", alpha=0.3)
        axis.set_title(family, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("cosine of the estimated gradient with the exact ∇J (unitless; 1 = exact direction)",
                           fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    _title_and_legend(figure, "Gradient quality per group of K responses (mean and 95% CI over groups)",
                      handles, labels)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def plot_learning(rows: list[Row], path: Path, protocol: str) -> None:
    """Exact expected reward J over policy-gradient steps under ``protocol``, one panel per
    regime on a grid of ``COLUMNS`` columns, mean over the learning seeds."""
    plt = pyplot()
    regimes = list(dict.fromkeys(row.regime for row in rows))
    columns = min(COLUMNS, len(regimes))
    lines = (len(regimes) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(WIDTH_INCHES, 0.9 + 2.2 * lines), squeeze=False, sharex=True)
    for axis, regime in zip(axes.flat, regimes):
        for row in (row for row in rows if row.regime == regime):
            axis.plot(row.curves[protocol], label=row.estimator, linewidth=1.2,
                      linestyle="--" if row.estimator.startswith("oracle") else "-")
        axis.set_title(regime, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(regimes):]:
        axis.axis("off")
    for axis in axes[:, 0]:
        axis.set_ylabel("exact E[reward]", fontsize=8)
    for column in range(columns):
        used = [axis for axis in axes[:, column] if axis.has_data()]
        if used:
            used[-1].set_xlabel("policy-gradient step", fontsize=8)
            used[-1].xaxis.set_tick_params(labelbottom=True)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    _title_and_legend(figure, f"Exact expected reward J while learning ({protocol} steps; mean over seeds)",
                      handles, labels)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def _title_and_legend(figure, title: str, handles: list, labels: list) -> None:  # type: ignore[no-untyped-def]
    """The title on the first line of the top margin, the legend (up to 4 entries a line)
    below it, the panels below both."""
    height = figure.get_figheight()  # inches
    legend_lines = (len(labels) + 3) // 4
    figure.suptitle(title, fontsize=10, y=1 - 0.08 / height, va="top")
    figure.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.35 / height),
                  ncol=min(4, len(labels)), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0, 1, 1 - (0.45 + 0.22 * legend_lines) / height))
