"""``leaf forkability``: usable fork-fire rate of LEAF boundaries from rollout logs."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "forkability"
HELP = ("Forkability of rollouts (paper Section 5): usable fork-fire rate r_f with CIs, per-position curve, "
        "fired group size, reward spread and depth quantiles, from JSONL rollout logs.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=Path, nargs="+", required=True, metavar="FILE.jsonl",
                        help="rollout logs (one group per line); each file is one row of the table")
    parser.add_argument("--fork-budget", type=int, default=2, help="LEAF fork budget B (default 2)")
    parser.add_argument("--tau", type=float, default=0.0, help="reward-spread tolerance of a usable fire (default 0)")
    parser.add_argument("--horizon", choices=("shortest", "each"), default="shortest",
                        help="LEAF candidate horizon (default: shortest, the paper)")
    parser.add_argument("--out", type=Path, default=Path("results/forkability"), help="directory for CSV, MD and PNG")
    parser.add_argument("--groups-per-batch", type=int, default=256, help="groups estimated at once (default 256)")
    parser.add_argument("--min-attempts", type=int, default=15,
                        help="positions with fewer attempts are left out of the plot (default 15, the paper)")
    parser.add_argument("--max-position", type=int, help="clip the plot's x axis at this position")
    parser.add_argument("--resamples", type=int, default=5000,
                        help="per-position bootstrap resamples of the pooled rate (default 5000, the paper)")


def run(args: argparse.Namespace) -> int:
    from leaf_plugins.analysis.forkability import POSITION_COLUMNS, SUMMARY_COLUMNS, forkability_from_batches
    from leaf_plugins.analysis.plots import plot_usable_rate
    from leaf_plugins.analysis.rollout_log import batches_from_groups, read_groups
    from leaf_plugins.analysis.tables import summary_markdown, write_csv

    summaries, positions, curves = [], [], {}
    for path in args.rollouts:
        label = path.stem
        batches = (batch for batch, _ in batches_from_groups(read_groups(path), args.groups_per_batch))
        report = forkability_from_batches(batches, fork_budget=args.fork_budget, tau=args.tau, label=label,
                                          horizon=args.horizon)
        summaries.append(report.summary(resamples=args.resamples))
        curve = report.per_position()
        curves[label] = curve
        positions.extend(curve)
    table = summary_markdown(summaries, args.tau)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "forkability.md").write_text(table + "\n")
    write_csv(summaries, SUMMARY_COLUMNS, args.out / "forkability.csv")
    write_csv(positions, POSITION_COLUMNS, args.out / "forkability_positions.csv")
    plot_usable_rate(curves, args.out / "usable_rate.png", args.min_attempts, args.max_position)
    print(table)
    print(f"\nwritten: {args.out}/forkability.md, forkability.csv, forkability_positions.csv, usable_rate.png")
    return 0
