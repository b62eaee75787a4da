"""The allowed ranges of the numeric run and warm-start options, as config validators
(checked at load time with ``file:line:col``, so no absurd value reaches the trainer)."""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["number_in", "RUN_RANGES", "WARM_START_RANGES"]

INT_LIMIT = 2**31 - 1  # sizes and counts beyond this cannot be allocated; seeds must fit torch's generator


def number_in(low: float, high: float, integer: bool = False, low_open: bool = False,
              high_open: bool = False) -> Callable[[Any], str | None]:
    """A validator: the value is a finite number in the interval (an int if ``integer``)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    interval = f"{left}{_text(low)}, {_text(high)}{right}"

    def check(value: Any) -> str | None:
        if integer and not isinstance(value, int):
            return f"expected an integer in {interval}, got {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number in {interval}, got {value!r}"
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            return f"must lie in {interval}, got {value!r}"
        return None

    return check


def _text(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _count(low: int = 1) -> Callable[[Any], str | None]:
    return number_in(low, INT_LIMIT, integer=True)


def _positive(high: float = 1e6) -> Callable[[Any], str | None]:
    return number_in(0, high, low_open=True)


RUN_RANGES: dict[str, Callable[[Any], str | None]] = {
    "seed": _count(0),
    "steps": _count(),
    "checkpoint_every": _count(),
    "backbone.seed": _count(0),
    "rollout.group_size": _count(),
    "rollout.prompts_per_step": _count(),
    "rollout.max_new_tokens": _count(),
    "rollout.max_prompt_tokens": _count(),
    "rollout.temperature": _positive(),
    "rollout.top_p": number_in(0, 1, low_open=True),
    "optim.learning_rate": _positive(),
    "optim.micro_batch_prompts": _count(),
    "optim.clip_epsilon": number_in(0, 1e6),
    "optim.kl_coefficient": number_in(0, 1e6),
    "optim.updates_per_rollout": number_in(1, 1000, integer=True),
    "optim.mini_batches": _count(),
    "optim.max_grad_norm": lambda value: None if value is None else _positive(1e30)(value),
    "optim.warmup_steps": _count(0),
    "optim.weight_decay": number_in(0, 1e6),
    "optim.clip_epsilon_high": lambda value: None if value is None else number_in(0, 1e6)(value),
    "optim.dual_clip": lambda value: None if value is None else number_in(1, 1e6, low_open=True)(value),
    "optim.entropy_coefficient": number_in(0, 1e6),
    "optim.rollout_correction_cap": number_in(1, 1e30),
    "rollout.max_sampling_rounds": number_in(1, 1000, integer=True),
    "rollout.overlong_buffer": lambda value: None if value is None else _count()(value),
    "rollout.overlong_penalty_factor": number_in(0, 1e6),
    "lora.rank": _count(),
    "lora.alpha": _count(),
    "lora.dropout": number_in(0, 1, high_open=True),
}
"""Dotted key of a run config -> its validator."""

WARM_START_RANGES: dict[str, Callable[[Any], str | None]] = {
    "seed": _count(0),
    "epochs": _count(),
    "batch_size": _count(),
    "learning_rate": _positive(),
    "backbone.seed": _count(0),
}
"""Dotted key of a warm-start config -> its validator."""
