"""``leaf train CONFIG [a.b=value ...]``: one RL training run from a YAML file."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "train"
HELP = "Train a speech LLM with RL from a YAML run config (re-running the same command resumes)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="YAML run config (see docs/training.md)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. estimator.name=grpo")
    parser.add_argument("--check", action="store_true", help="only validate the config")


def run(args: argparse.Namespace) -> int:
    from leaf_plugins.training.config import load_train_config, task_examples

    config = load_train_config(args.config, args.overrides)
    if args.check:
        print(f"{args.config}: OK")
        return 0
    from leaf_plugins.training.trainer import Trainer

    metrics = Trainer(config, task_examples(config.task)).run()
    if metrics:
        last = metrics[-1]
        print(f"done: reward {last['reward_mean']:.4f}, kl {last['kl']:.4f}; outputs in {config.output_dir}")
    return 0
