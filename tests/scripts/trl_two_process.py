"""Two `accelerate launch` CPU processes train LeafGRPOTrainer on one prompt x K = 4 per
step, so each group is split between the processes; each rank saves what reached its loss."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_integrations_trl import record_losses, trainer  # noqa: E402


def main(out: Path) -> None:
    run = trainer(out, estimator="leaf", estimator_params={"fork_budget": 2}, per_device_train_batch_size=2,
                  max_steps=2)
    seen = record_losses(run)
    run.train()
    rank = run.accelerator.process_index
    torch.save({"world": run.accelerator.num_processes, "seen": seen}, out / f"rank{rank}.pt")
    # destroy the process group before exit: gloo's threads torn down at interpreter exit
    # can abort the process (SIGABRT, "terminate called without an active exception")
    run.accelerator.end_training()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
