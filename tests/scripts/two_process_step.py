"""Under ``accelerate launch``: the gradient of a fixed step (each rank on its share of
the prompts, after DDP's all-reduce), then one training step; each rank saves both.

Usage: accelerate launch --cpu --num_processes 2 two_process_step.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leaf_plugins.training.lora import lora_state  # noqa: E402
from leaf_plugins.training.trainer import Trainer  # noqa: E402
from leaf_plugins.training.whole_step import prompt_share  # noqa: E402
from training_cases import config, examples, host, step_gradient  # noqa: E402


def main(output: Path) -> None:
    trainer = Trainer(config(output / "run", "leaf", steps=1, checkpoint_every=1), examples(), host=host())
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    gradient = step_gradient(trainer, examples()[:4], rank, world)
    metrics = trainer.run()
    torch.save({"lora": lora_state(trainer.policy), "world": world, "gradient": gradient,
                "prompts": len(prompt_share(len(trainer._prompts_of(0)), rank, world)), "metrics": metrics}, output / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
