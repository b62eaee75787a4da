"""The estimator speed table from a pytest-benchmark JSON file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SpeedRow", "read_speed_rows", "speed_table", "plot_speed"]


@dataclass(frozen=True)
class SpeedRow:
    size: str
    estimator: str
    median_ms: float
    min_ms: float
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / (self.median_ms / 1000)


def read_speed_rows(path: Path) -> list[SpeedRow]:
    """One row per benchmark of ``benchmarks/test_speed_estimators.py``."""
    data = json.loads(Path(path).read_text())
    rows = []
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        stats = bench["stats"]
        rows.append(SpeedRow(info["size"], info["estimator"], stats["median"] * 1000, stats["min"] * 1000, info["tokens"]))
    return rows


def speed_table(rows: list[SpeedRow]) -> str:
    """Markdown: median and fastest time, tokens/s (median), time relative to grpo at the
    same size (from the medians and from the fastest rounds), and how many times faster
    than the pure-Python reference where it was measured."""
    by_key = {(row.size, row.estimator): row for row in rows}
    lines = [
        "| batch (prompts×K×tokens) | estimator | median ms | min ms | tokens/s | × grpo time (median) "
        "| × grpo time (min) | reference / estimator |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    sizes = list(dict.fromkeys(row.size for row in rows))
    for size in sizes:
        grpo = by_key.get((size, "grpo"))
        for row in rows:
            if row.size != size or row.estimator.endswith("(reference)"):
                continue
            ratio = f"{row.median_ms / grpo.median_ms:.1f}" if grpo else "–"
            fastest = f"{row.min_ms / grpo.min_ms:.1f}" if grpo else "–"
            reference = by_key.get((size, f"{row.estimator} (reference)"))
            speedup = f"{reference.median_ms / row.median_ms:,.0f}×" if reference else "–"
            lines.append(
                f"| {size} | {row.estimator} | {row.median_ms:.2f} | {row.min_ms:.2f} | {row.tokens_per_second:,.0f} "
                f"| {ratio} | {fastest} | {speedup} |"
            )
    return "\n".join(lines)


def plot_speed(rows: list[SpeedRow], path: Path) -> None:
    """Bar chart of tokens/s per estimator and batch size (log scale) as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(row.size for row in rows))
    estimators = list(dict.fromkeys(row.estimator for row in rows if not row.estimator.endswith("(reference)")))
    figure, axis = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(len(estimators), 1)
    for index, estimator in enumerate(estimators):
        values = [next((r.tokens_per_second for r in rows if r.size == s and r.estimator == estimator), 0) for s in sizes]
        axis.bar([i + index * width for i in range(len(sizes))], values, width, label=estimator)
    axis.set_xticks([i + width * (len(estimators) - 1) / 2 for i in range(len(sizes))], sizes)
    axis.set_yscale("log")
    axis.set_ylabel("tokens / s")
    axis.set_title("Estimator throughput (CPU)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
