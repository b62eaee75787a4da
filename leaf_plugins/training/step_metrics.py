"""What a step logs (``metrics.jsonl``, the trackers, the progress bar's postfix): the
whole step's rewards, lengths and advantages, its sampling, its updates', its speed.

Every figure is the whole step's (every process's rows, gathered), the same on any
number of processes, but for the wall-clock ones (``*_seconds``, ``tokens_per_second``)
and ``peak_memory_bytes`` (the most any process's CUDA allocator held during the step).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["step_metrics", "POSTFIX", "WALL_CLOCK_METRICS", "reproducible"]

POSTFIX = ("reward_mean", "loss", "entropy")
"""The metrics the progress bar shows beside the step count."""


WALL_CLOCK_METRICS = ("rollout_seconds", "estimator_seconds", "update_seconds", "tokens_per_second",
                      "peak_memory_bytes")
"""The metrics that measure the machine, not the training: they differ between two runs
that train the same thing."""


def reproducible(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` without the wall-clock ones (``WALL_CLOCK_METRICS``): what two runs that
    train the same thing log alike."""
    return {name: value for name, value in metrics.items() if name not in WALL_CLOCK_METRICS}


def step_metrics(step: Any, advantages: torch.Tensor, updates: dict[str, float], reward_names: Sequence[str],
                 penalised: bool) -> dict[str, float]:
    """The logged metrics of an assembled step (``step_sampling.AssembledStep``).

    :param advantages: ``[M, T]`` the estimator's advantages of the step's estimated rows.
    :param updates: ``update_policy``'s.
    :param penalised: whether the run adds penalties to the scores (an overlong penalty,
        a KL penalty): then ``reward_penalty_mean`` is logged.
    """
    rows = step.estimated.nonzero().squeeze(1)  # [M]
    scores = step.scores[rows]
    lengths = step.whole.lengths[rows].float()
    mask = step.whole.mask[rows]
    token_advantages = advantages[mask.to(advantages.device)]
    metrics = {
        "reward_mean": float(scores.mean()),
        "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        **{f"reward/{name}": float(step.parts[rows, index].mean()) for index, name in enumerate(reward_names)},
        "response_tokens_mean": float(lengths.mean()),
        "response_tokens_max": float(lengths.max()),
        "response_tokens_min": float(lengths.min()),
        "truncated_fraction": float(step.truncated[rows].float().mean()),
        "advantage_mean": float(token_advantages.mean()) if token_advantages.numel() else 0.0,
        "advantage_abs_mean": float(token_advantages.abs().mean()) if token_advantages.numel() else 0.0,
        "groups_dropped": float(step.dropped),
        "zero_std_groups": step.zero_std_groups / max(step.groups_sampled, 1),
        "sampling_rounds": float(step.rounds),
        **updates,
    }
    if penalised:
        metrics["reward_penalty_mean"] = float(step.penalties[rows].mean())
    return metrics
