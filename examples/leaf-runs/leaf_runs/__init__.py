"""``leaf runs RUN_DIR ...``: one line per training run directory: the last logged step,
its metrics (``--metrics``; reward and KL by default), the newest checkpoint, and the
plugins the run config named."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from leaf_plugins import ConfigError, hookimpl
from leaf_plugins.core.command import Command

METRICS = ("reward_mean", "kl")  # the metrics shown unless --metrics names others


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="output directories of `leaf train`")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), metavar="NAME",
                        help=f"metrics.jsonl keys to show, of the last step (default: {' '.join(METRICS)})")


def summary(run: Path, metric_names: tuple[str, ...] = METRICS) -> tuple[str, ...]:
    """The row of one run directory."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{run}: no metrics.jsonl (not a leaf train output directory, or no step finished yet)")
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    last = json.loads(lines[-1])
    checkpoints = sorted(path.name for path in run.glob("checkpoint-*"))
    record = run / "plugins.json"
    plugins = json.loads(record.read_text())[-1]["plugins"] if record.is_file() else []
    named = ",".join(f"{p['name']}=={p['version']}" if p["version"] else p["name"] for p in plugins) or "-"
    missing = [name for name in metric_names if name not in last]
    if missing:
        raise ConfigError(f"{metrics}: no metric {missing[0]!r}; its metrics: {', '.join(sorted(last))}")
    return (str(run), str(last["step"]), *(f"{last[name]:.4f}" for name in metric_names),
            checkpoints[-1] if checkpoints else "-", named)


def run(args: argparse.Namespace) -> int:
    names = tuple(args.metrics)
    columns = ("run", "step", *names, "checkpoint", "plugins")
    rows = [columns, *(summary(path, names) for path in args.runs)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(columns))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


@hookimpl
def register_commands(register):
    register("runs", Command("Summarise training runs: last step, reward, KL, newest checkpoint, plugins.",
                             add_arguments, run))
