"""FSDP2 sharding of the policy (``sharding: fsdp2``), applied by hand.

``fully_shard`` (``torch.distributed.fsdp``) is applied to every decoder layer of the
language model, then to the root (the PeftModel, LoRA attached): each process keeps
``1 / world`` of every parameter, LoRA's included, and all-gathers a layer's weights for
its forward and backward. The Adam optimizer is built on the sharded parameters, so its
states are sharded too. accelerate's own FSDP plugin is not used: accelerate 1.15 runs
FSDP only on accelerators, while this works on the CPU with gloo as on CUDA with NCCL.

The gradient is the one process's gradient of the whole step, as under DDP: every
process back-propagates its share of the step's loss times the process count
(``training/update.py``), and FSDP2's reduce-scatter averages over the processes, so each
shard receives the sum of the processes' gradients. Between micro-batches the gradients
accumulate unsharded on every process and are reduce-scattered once, at the last
micro-batch (``gradients_accumulated_locally``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.rollout.prompt_embedding import language_model_of


__all__ = ["SHARDING_MODES", "shard_policy", "is_sharded", "prepare_training", "gradients_accumulated_locally"]

SHARDING_MODES = ("none", "fsdp2")
"""``none``: every process holds the whole model (DDP over several processes);
``fsdp2``: parameters, gradients and optimizer states sharded over the processes."""


def shard_policy(model: torch.nn.Module, accelerator: Accelerator) -> torch.nn.Module:
    """``model`` (a PeftModel, LoRA attached, activation checkpointing already set) with
    FSDP2 applied per decoder layer of its language model, then at the root, over all the
    run's processes; the parameters move to ``accelerator.device`` as they are sharded.
    Every forward pass then gathers each layer's weights from all processes: the update
    makes the same passes on every process whatever its share (``update.py``).

    :raises ConfigError: on one process (nothing to shard over), or when accelerate was
        launched with its own FSDP or DeepSpeed configuration (it would wrap the model
        again).
    """
    if accelerator.num_processes < 2:
        raise ConfigError("sharding: fsdp2 shards the model over several processes, and this run has one: launch it "
                          "with `torchrun --nproc_per_node N -m leaf_plugins.cli train …` (or accelerate launch "
                          "--multi_gpu), or set sharding: none")
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ConfigError(f"sharding: fsdp2 shards the model itself, but accelerate was launched with "
                          f"distributed_type {accelerator.distributed_type.value}, which would wrap it again: launch "
                          f"with torchrun or `accelerate launch --multi_gpu` instead of an FSDP/DeepSpeed config")
    mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    for layer in language_model_of(model).layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s root is sharded with FSDP2 (``shard_policy``)."""
    return isinstance(model, FSDPModule)


def prepare_training(accelerator: Accelerator, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and optimizer the trainer steps: ``accelerator.prepare`` on both (DDP
    over several processes), except that a sharded model is left as it is (DDP around it
    would average its gradients a second time) and only the optimizer is prepared.

    DDP syncs the buffers once, when it wraps the model, and not before each forward
    pass: no buffer is trained (the rotary tables are constants, the frozen audio
    encoder runs outside the update), and a broadcast per forward pass would make the
    collectives a process makes depend on how many passes its data takes."""
    if is_sharded(model):
        return model, accelerator.prepare(optimizer)
    model, optimizer = accelerator.prepare(model, optimizer)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.broadcast_buffers = False  # torch >= 2.13 names it forward_sync_buffers (this sets it)
    return model, optimizer


@contextlib.contextmanager
def gradients_accumulated_locally(accelerator: Accelerator, model: torch.nn.Module) -> Iterator[None]:
    """Inside this block backward passes accumulate gradients on this process only: FSDP2
    keeps them unsharded (``set_requires_gradient_sync(False)``) and reduce-scatters their
    sum at the next backward outside the block; DDP skips its all-reduce
    (``accelerator.no_sync``)."""
    if not is_sharded(model):
        with accelerator.no_sync(model):
            yield
        return
    sharded: Any = model
    sharded.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        sharded.set_requires_gradient_sync(True)
