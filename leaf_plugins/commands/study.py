"""``leaf study FILE [a.b=value ...]``: run a YAML-declared ablation study."""

from __future__ import annotations

import argparse
from pathlib import Path

from leaf_plugins.commands import require_training_stack, written_line

NAME = "study"
HELP = ("Run every variation x seed of a study file (train, evaluate on held-out examples), skipping finished "
        "runs, and write the results table (Markdown, CSV) and learning curves (PNG).")
EPILOG = """examples:
  leaf study configs/studies/demo.yaml
  leaf study configs/studies/fork-budget-sweep.yaml seeds=[0] base.steps=50
  leaf study configs/studies/demo.yaml --table

A grid value, variation or override that sets the estimator's name keeps the base's
estimator parameters it reads and leaves out those it does not (one note names them),
as leaf train does (docs/studies.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", type=Path, help="YAML study file (see docs/studies.md)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="overrides of the study file, e.g. base.steps=10 seeds=[0]")
    parser.add_argument("--check", action="store_true", help="only validate the file and list its runs")
    parser.add_argument("--table", action="store_true",
                        help="only rewrite the results table from the study's saved files (no training, no judging)")


def run(args: argparse.Namespace) -> int:
    require_training_stack()
    from leaf_plugins.studies.config import load_study

    study = load_study(args.study, args.overrides)
    if args.check:
        print(f"{args.study}: OK, {len(study.runs)} runs ({len(study.variations)} variations x "
              f"{len(study.config.seeds)} seeds) -> {study.output_dir}")
        for variation in study.variations:
            print(f"  {variation}")
        return 0
    if args.table:
        from leaf_plugins.studies.results import write_results

        written = write_results(study)
        print(written[0].read_text())
        print(written_line(written))
        return 0
    from leaf_plugins.studies.runner import run_study

    try:
        written = run_study(study)
    except KeyboardInterrupt as interrupt:  # `leaf` prints what was kept and exits with 130 (143: SIGTERM)
        current = getattr(interrupt, "kept", None)
        interrupt.kept = (f"the finished runs in {study.output_dir}"  # type: ignore[attr-defined]
                          + (f" and the current run's {current}" if current else ""))
        raise
    if written:  # the main process of a launch, which wrote them
        print()
        print(written[0].read_text())
        print(f"{written_line(written)}; each run's files in its directory under {study.output_dir / 'runs'}")
    return 0
