"""``leaf forkability``: usable fork-fire rate of LEAF boundaries from rollout logs."""

from __future__ import annotations

import argparse
from pathlib import Path

from leaf_plugins.commands import written_line

NAME = "forkability"
HELP = ("Forkability of rollouts (paper Section 5): usable fork-fire rate r_f with CIs, per-position curve, "
        "fired group size, reward spread and depth quantiles, from JSONL rollout logs or a fresh sampling pass.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rollouts", type=Path, nargs="+", metavar="FILE.jsonl",
                        help="rollout logs (one group per line, `log_rollouts: true` in a run); each file is one row")
    source.add_argument("--sample", type=Path, metavar="RUN.yaml",
                        help="a fresh sampling pass: K responses per example of a split, with the backbone, task, "
                             "reward and rollout settings of this run config")
    parser.add_argument("--checkpoint", type=Path, metavar="RUN_DIR",
                        help="with --sample: the run directory whose newest checkpoint samples (default: the run "
                             "config's output_dir if it has a checkpoint, else the starting model)")
    parser.add_argument("--split", default="validation", help="with --sample: the task split (default validation)")
    parser.add_argument("--limit", type=int, help="with --sample: only the first N examples")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="with --sample: run-config overrides, e.g. rollout.group_size=16")
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
    from leaf_plugins.analysis.tables import summary_markdown, write_csv

    summaries, positions, curves = [], [], {}
    for label, batches in (_sampled(args) if args.sample else _logged(args)):
        report = forkability_from_batches(batches, fork_budget=args.fork_budget, tau=args.tau, label=label,
                                          horizon=args.horizon)
        summaries.append(report.summary(resamples=args.resamples))
        curve = report.per_position()
        curves[label] = curve
        positions.extend(curve)
    table = summary_markdown(summaries, args.tau)
    args.out.mkdir(parents=True, exist_ok=True)
    table_path = args.out / "forkability.md"
    table_path.write_text(table + "\n")
    written = [table_path, write_csv(summaries, SUMMARY_COLUMNS, args.out / "forkability.csv"),
               write_csv(positions, POSITION_COLUMNS, args.out / "forkability_positions.csv"),
               plot_usable_rate(curves, args.out / "usable_rate.png", args.min_attempts, args.max_position)]
    print(table)
    print(f"\n{written_line(written)}")
    return 0


def _logged(args: argparse.Namespace):
    """One (label, batches) per rollout log."""
    from leaf_plugins.rollout.log import batches_from_groups, read_groups

    for label, path in zip(_labels(args.rollouts), args.rollouts):
        yield label, (batch for batch, _ in batches_from_groups(read_groups(path), args.groups_per_batch))


def _labels(paths: list[Path]) -> list[str]:
    """File stems, or, when stems repeat (``runs/*/rollouts.jsonl``), as many parent
    directories as it takes to tell the files apart."""
    for depth in range(1, max(len(path.parts) for path in paths) + 1):
        labels = ["/".join([*path.parent.parts[len(path.parent.parts) - depth + 1:], path.stem])
                  if depth > 1 else path.stem for path in paths]
        if len(set(labels)) == len(labels):
            return labels
    return [str(path) for path in paths]


def _sampled(args: argparse.Namespace):
    """(label, batches) of a fresh sampling pass of a run's policy over a task split."""
    from leaf_plugins.evaluation.fresh_sampling import sampled_batches
    from leaf_plugins.evaluation.sampling import run_to_sample
    from leaf_plugins.training.config import load_train_config

    config = load_train_config(args.sample, args.overrides)
    run_dir = run_to_sample(config.output_dir, args.checkpoint)
    label = f"{(run_dir.name if run_dir else config.backbone.name)}-{args.split}"
    yield label, sampled_batches(config, run_dir, args.split, args.limit)
