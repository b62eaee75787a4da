"""The optimizer of a run and what acts around its step: AdamW over the adapter, the
learning-rate schedule over the run's steps, and gradient-norm clipping.

The learning rate is a function of the training step (one rollout), not of the optimizer
step: every update of a step (``optim.updates_per_rollout`` passes of
``optim.mini_batches`` optimizer steps each) uses the step's rate. With
``warmup_steps = w`` and ``steps = S``, step ``s`` (1-based) trains at
``learning_rate × factor(s)``:

* warmup, ``s <= w``: ``s / w``, a line from 0 (before step 1) to 1 at step ``w``;
* ``constant``: 1 after the warmup;
* ``linear``: ``(S + 1 - s) / (S + 1 - w)``, a line from 1 at step ``w`` to 0 at step
  ``S + 1``, so the last step still trains (at ``1 / (S + 1 - w)``);
* ``cosine``: ``(1 + cos(π (s - w) / (S + 1 - w))) / 2``, the same end points.

The schedule is torch's ``LambdaLR`` over the optimizer, stepped once per training step;
its state is in every checkpoint. A resumed run whose ``steps`` was raised keeps the
steps it trained and plans the rest over the new total: from the step reached on, the
factor is the new schedule's (for ``linear`` and ``cosine`` a rise at the resume, since
the decay now spreads over more steps).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["LR_SCHEDULES", "schedule_factor", "build_optimizer", "build_schedule", "set_schedule_step",
           "gradient_norm", "clip_gradients", "inner_optimizer"]

LR_SCHEDULES = ("constant", "linear", "cosine")
"""``optim.lr_schedule``: the learning rate after the warmup (see the module's text)."""


def schedule_factor(step: int, steps: int, schedule: str, warmup_steps: int) -> float:
    """The factor of ``optim.learning_rate`` at training step ``step`` (1-based) of a run of
    ``steps`` steps.

    :raises ValueError: for a schedule not in ``LR_SCHEDULES``.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    if step <= warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / (steps + 1 - warmup_steps)  # (0, 1) over the steps after the warmup
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(parameters: Iterable[torch.nn.Parameter], learning_rate: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable ``parameters`` (decoupled weight decay; with
    ``weight_decay`` 0 it is Adam, step for step)."""
    return torch.optim.AdamW(list(parameters), lr=learning_rate, weight_decay=weight_decay)


def build_schedule(optimizer: torch.optim.Optimizer, steps: int, schedule: str, warmup_steps: int) -> LambdaLR:
    """The learning-rate schedule of a run of ``steps`` steps (``schedule_factor``), set to
    step 1; ``scheduler.step()`` after each training step moves it on."""
    factor: Callable[[int], float] = lambda done: schedule_factor(done + 1, steps, schedule, warmup_steps)
    return LambdaLR(inner_optimizer(optimizer), factor)


def set_schedule_step(scheduler: LambdaLR, completed: int) -> None:
    """Put the schedule at training step ``completed + 1`` (after a resume) and give the
    optimizer that step's learning rate, computed from the schedule as built now (its
    ``steps`` may have been raised since the checkpoint)."""
    scheduler.last_epoch = completed
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(completed)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]  # what get_last_lr() reports


def gradient_norm(parameters: list[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients of ``parameters``. Sharded (FSDP2) gradients
    are DTensors: their norm is taken over all the shards (a collective), so every
    process gets the same norm. Parameters without a gradient count as 0."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else torch.zeros(())
    if hasattr(norm, "full_tensor"):  # a DTensor: the reduction over the shards
        norm = norm.full_tensor()
    return float(norm)


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float, norm: float) -> None:
    """Scale the gradients of ``parameters``, whose global norm is ``norm``
    (``gradient_norm``), by ``min(1, max_norm / (norm + 1e-6))`` (torch's
    ``clip_grad_norm_`` rule)."""
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, torch.tensor(norm))


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer``."""
    return getattr(optimizer, "optimizer", optimizer)
