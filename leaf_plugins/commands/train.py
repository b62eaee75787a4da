"""``leaf train CONFIG [a.b=value ...]``: one RL training run from a YAML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from leaf_plugins.commands import require_training_stack

NAME = "train"
HELP = "Train a speech LLM with RL from a YAML run config (re-running the same command resumes)."
EPILOG = """examples:
  leaf train configs/runs/tiny-qwen2-audio.yaml
  leaf train configs/runs/tiny-qwen2-audio.yaml estimator.name=grpo steps=50 output_dir=runs/tiny-qwen2-audio-grpo
  leaf train configs/runs/tiny-qwen2-audio.yaml --check 'estimator.params={fork_budget: 4}'

switching the estimator: parameters belong to the estimator named in the same place.
An override of estimator.name keeps the file's estimator.params the new estimator reads
and leaves out those it does not (one note names them and their file:line:col); a
parameter given on the command line, or one no estimator reads, is checked and an error
with a did-you-mean. 'estimator.params={...}' replaces them all (docs/training.md).

plugins: a run uses the training-stage hooks (rollout, score_rollouts, compute_loss, ...)
of the plugins its config names, e.g. 'plugins=[length-penalty]', and of no other
(leaf plugins --kind stage lists those installed; docs/plugins.md).

A run resumes from the newest checkpoint in its output_dir (and says from which step),
on any number of processes, sharded or not. The run writes its resolved config to
output_dir/config.yaml; resuming with settings that train something else is an error
naming them (steps, output_dir, checkpoint_every, keep_checkpoints, log_rollouts, threads,
sharding, optim.micro_batch_prompts and optim.activation_checkpointing may change): give
such a run its own output_dir.
  leaf train runs/tiny-qwen2-audio-leaf/config.yaml steps=40   # the same run, 40 steps"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="YAML run config (see docs/training.md), or a run directory "
                        "(its config.yaml: the resolved config the run wrote)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. estimator.name=grpo")
    parser.add_argument("--check", action="store_true", help="only validate the config")


def run(args: argparse.Namespace) -> int:
    require_training_stack()
    from leaf_plugins.core.plugins import get_host
    from leaf_plugins.training.config import load_train_config, task_examples
    from leaf_plugins.training.run_config import check_resumed_config, run_config_path

    path = run_config_path(args.config)
    config = load_train_config(path, args.overrides)
    check_resumed_config(Path(config.output_dir), config, get_host())
    if args.check:
        print(f"{path}: OK")
        return 0
    from leaf_plugins.training.trainer import Trainer

    trainer = Trainer(config, task_examples(config.task))
    metrics = trainer.run()
    if metrics and trainer.accelerator.is_main_process:  # one line under `accelerate launch`, not one per process
        last = metrics[-1]
        print(f"done: reward {last['reward_mean']:.4f}, kl {last['kl']:.4f}; outputs in {config.output_dir}")
    return 0
