"""Greedy boundary selection under the separation rule, for every group at once."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.group_stats import group_extreme

__all__ = ["separation", "shortest_lengths", "greedy_boundaries"]


def shortest_lengths(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` int64: the shortest response length lmin of every group."""
    return group_extreme(batch.lengths, batch.groups, "amin", empty=batch.width)


def separation(shortest: torch.Tensor, budget: int) -> torch.Tensor:
    """``[G]`` int64: the minimum distance Δ = max(2, floor(lmin / (B + 1)))."""
    return torch.clamp(torch.div(shortest, budget + 1, rounding_mode="floor"), min=2)


def greedy_boundaries(score: torch.Tensor, gap: torch.Tensor, budget: int) -> torch.Tensor:
    """Scan positions ``t >= 1`` in descending score (ties: smaller position first) and
    accept a position when it lies at least ``gap`` from every accepted one, up to
    ``budget``.

    Taking, ``budget`` times, the best admissible position not within ``gap`` of an
    accepted one is the same as the sequential scan, since accepting only adds exclusions.

    :param score: ``[G, T]`` float score per position, ``-inf`` where a position may not
        be chosen. Overwritten.
    :param gap: ``[G]`` int64 separation Δ per group.
    :return: ``[G, budget]`` int64 accepted positions in the order accepted, ``0`` where
        unused (the form ``Boundaries`` takes and sorts).
    """
    groups, width = score.shape
    if width == 0 or budget == 0:
        return torch.zeros((groups, budget), dtype=torch.int64, device=score.device)
    score[:, 0] = -torch.inf  # boundaries start at t = 1; a round with nothing left picks 0
    positions = torch.arange(width, device=score.device)  # [T]
    gap = gap.unsqueeze(1)  # [G, 1]
    picks = [score.max(dim=1, keepdim=True).indices]  # [G, 1] each: the first maximum
    for _ in range(budget - 1):  # exclude around the last pick, pick again
        score.masked_fill_((positions - picks[-1]).abs_() < gap, -torch.inf)
        picks.append(score.max(dim=1, keepdim=True).indices)
    return torch.cat(picks, dim=1)
