"""The estimator speed table from a pytest-benchmark JSON file."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SpeedRow", "read_speed_rows", "combine_runs", "speed_caption", "speed_table", "ratio_spread",
           "plot_speed"]


@dataclass(frozen=True)
class SpeedRow:
    size: str
    estimator: str
    median_ms: float
    min_ms: float
    tokens: int
    threads: int | None = None  # torch's CPU threads during the calls (None: not recorded)

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
        rows.append(SpeedRow(info["size"], info["estimator"], stats["median"] * 1000, stats["min"] * 1000,
                             info["tokens"], info.get("threads")))
    return rows


def combine_runs(runs: list[list[SpeedRow]]) -> list[SpeedRow]:
    """One row per (size, estimator) from repeated runs of the suite: the median of the
    runs' medians and the fastest round of all runs (row order of the first run)."""
    keyed: dict[tuple[str, str], list[SpeedRow]] = {}
    for rows in runs:
        for row in rows:
            keyed.setdefault((row.size, row.estimator), []).append(row)
    return [
        SpeedRow(size, estimator, statistics.median(r.median_ms for r in found), min(r.min_ms for r in found),
                 found[0].tokens, found[0].threads)
        for (size, estimator), found in keyed.items()
    ]


def ratio_spread(runs: list[list[SpeedRow]]) -> str:
    """Markdown: each estimator's median time over grpo's, per size and per run, so that
    the spread between runs on a shared machine is in plain view."""
    lines = ["| batch | estimator | × grpo time (median), per run |", "|---|---|---|"]
    first = runs[0]
    keyed_runs = [{(row.size, row.estimator): row for row in rows} for rows in runs]
    for size in dict.fromkeys(row.size for row in first):
        for estimator in dict.fromkeys(r.estimator for r in first if r.size == size and r.estimator != "grpo"
                                       and not r.estimator.endswith("(reference)")):
            ratios = []
            for by_key in keyed_runs:
                grpo, row = by_key.get((size, "grpo")), by_key.get((size, estimator))
                if grpo and row:
                    ratios.append(f"{row.median_ms / grpo.median_ms:.1f}")
            lines.append(f"| {size} | {estimator} | {', '.join(ratios)} |")
    return "\n".join(lines)


def speed_caption(rows: list[SpeedRow], device: str = "the CPU") -> str:
    """The sentence above the speed table: where the estimators ran and at how many torch
    CPU threads (every count the rows recorded, or that none was recorded)."""
    counts = sorted({row.threads for row in rows if row.threads is not None})
    if not counts:
        return f"Estimators on {device}; thread count not recorded."
    plural = "s" if counts != [1] else ""
    return f"Estimators on {device} at {' and '.join(map(str, counts))} torch CPU thread{plural} (--threads)."


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
            speedup = _times(reference.median_ms / row.median_ms) if reference else "–"
            lines.append(
                f"| {size} | {row.estimator} | {row.median_ms:.2f} | {row.min_ms:.2f} | {row.tokens_per_second:,.0f} "
                f"| {ratio} | {fastest} | {speedup} |"
            )
    return "\n".join(lines)


def _times(ratio: float) -> str:
    """``87×``, or ``0.8×`` for ratios below 10."""
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


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
    axis.set_xlabel("batch (prompts × K × tokens per response)")
    axis.set_ylabel("tokens per second (log scale)")
    axis.set_title("Estimator throughput (CPU)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
