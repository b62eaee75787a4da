"""``leaf warm-start CONFIG [a.b=value ...]``: supervised fine-tuning before RL."""

from __future__ import annotations

import argparse
from pathlib import Path

from leaf_plugins.commands import require_training_stack

NAME = "warm-start"
HELP = "Supervised fine-tuning on a task's references; saves a checkpoint RL runs load (backbone.path)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="YAML warm-start config (output_dir, epochs, backbone, task)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")


def run(args: argparse.Namespace) -> int:
    require_training_stack()
    from leaf_plugins.training.config import task_examples
    from leaf_plugins.training.warm_start import load_warm_start_config, warm_start

    config = load_warm_start_config(args.config, args.overrides)
    print(f"warm-started model: {warm_start(config, task_examples(config.task))}")
    return 0
