"""Checkpoints that a re-run resumes from exactly: adapter, optimizer, RNG states, step."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leaf_plugins.training.durable import fsync_directory, fsync_tree

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "remove_partials"]


def save_checkpoint(directory: Path, step: int, model: Any, optimizer: torch.optim.Optimizer) -> Path:
    """Write ``checkpoint-<step>`` atomically (a temporary directory, fsynced, renamed at
    the end) and keep only the newest one. The adapter is saved with peft's ``save_pretrained``.
    A step is written once: when ``checkpoint-<step>`` exists already (complete, since
    only a finished write has that name) it is kept as it is. Half-written ``.partial-*``
    directories of earlier, killed writes are removed first."""
    target = directory / f"checkpoint-{step:08d}"
    if target.is_dir():
        return target
    remove_partials(directory)
    partial = directory / f".partial-{step:08d}"
    partial.mkdir(parents=True)
    model.save_pretrained(partial / "adapter")
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        },
        partial / "state.pt",
    )
    fsync_tree(partial)  # the content is on disk before the name says it is complete
    partial.rename(target)
    fsync_directory(directory)
    for old in directory.glob("checkpoint-*"):
        if old != target:
            shutil.rmtree(old)
    return target


def remove_partials(directory: Path) -> None:
    """Delete the ``.partial-*`` directories of checkpoint writes that a kill cut short."""
    for partial in directory.glob(".partial-*"):
        shutil.rmtree(partial, ignore_errors=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, if any."""
    found = sorted(directory.glob("checkpoint-*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> int:
    """Restore adapter weights, optimizer and RNG states; return the step reached."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter = path / "adapter" / "adapter_model.safetensors"
    set_peft_model_state_dict(model, load_file(str(adapter)))
    state = torch.load(path / "state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"])
