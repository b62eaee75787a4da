"""Under ``torchrun`` with 2 processes (gloo, CPU), the trainer on ``tests/training_cases.py``'s
config.

``runs``: one after another in one process group, 4 steps unsharded (DDP), 4 steps with
``sharding: fsdp2`` (checkpoints every 2 steps, all kept), 4 steps of two clipped passes
of two mini-batches each (``UPDATES``) sharded and unsharded, the same sharded run stopped
after step 2 and continued to step 4, and the run that ``killed`` left, continued to
step 4. Each rank saves every run's metrics and its whole final adapter (sharded
tensors gathered) to ``rank<r>.pt``.

``killed``: the sharded 4-step run, in which rank 1 kills itself (SIGKILL) while
checkpoint 4 is being written, after writing its shards.

Usage: python -m torch.distributed.run --nproc_per_node 2 sharded_training.py OUTPUT_DIR runs|killed
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leaf_plugins.training.trainer import Trainer  # noqa: E402
from training_cases import config, examples, host  # noqa: E402


def whole_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors by name, sharded ones gathered to full tensors (collective)."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters() if p.requires_grad}


UPDATES = dict(updates_per_rollout=2, mini_batches=2, max_grad_norm=0.5, lr_schedule="cosine", warmup_steps=1,
               weight_decay=0.01)
"""The optimizer settings of the run ``updates``: two clipped passes of two mini-batches."""


def train(output: Path, sharding: str, steps: int, keep: int | str = 1, **optim) -> dict:
    settings = config(output, "leaf", steps=steps, checkpoint_every=2)
    settings.sharding, settings.keep_checkpoints = sharding, keep
    settings.optim = dataclasses.replace(settings.optim, **optim)
    trainer = Trainer(settings, examples(), host=host())
    start = whole_adapter(trainer.policy)
    metrics = trainer.run()
    return {"metrics": metrics, "start": start, "adapter": whole_adapter(trainer.policy),
            "world": trainer.accelerator.num_processes}


def killed_in_checkpoint(output: Path) -> None:
    """The sharded run; rank 1 dies right after writing its shards of checkpoint 4."""
    import torch.distributed.checkpoint as dcp

    save = dcp.save

    def save_then_die(state, checkpoint_id, **kwargs):
        written = save(state, checkpoint_id=checkpoint_id, **kwargs)
        if dist.get_rank() == 1 and ".partial-00000004" in str(checkpoint_id):
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    dcp.save = save_then_die
    train(output / "killed", "fsdp2", 4)


def main(output: Path) -> None:
    results = {
        "ddp": train(output / "ddp", "none", 4),
        "sharded": train(output / "sharded", "fsdp2", 4, keep="all"),
        "updates": train(output / "updates", "fsdp2", 4, **UPDATES),
        "updates_ddp": train(output / "updates_ddp", "none", 4, **UPDATES),
    }
    train(output / "resumed", "fsdp2", 2)  # stops after step 2 (a checkpoint)
    results["resumed"] = train(output / "resumed", "fsdp2", 4)
    results["after_kill"] = train(output / "killed", "fsdp2", 4)
    torch.save(results, output / f"rank{dist.get_rank()}.pt")  # the trainer ends the process group at exit


if __name__ == "__main__":
    (main if sys.argv[2] == "runs" else killed_in_checkpoint)(Path(sys.argv[1]))
