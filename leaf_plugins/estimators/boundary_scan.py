"""Greedy boundary selection under the separation rule, for every group at once."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.group_stats import group_extreme

__all__ = ["separation", "shortest_lengths", "greedy_boundaries", "ascending_used_first"]


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
    :return: ``[G, budget]`` int64 accepted positions, ascending, ``-1`` where unused.
    """
    groups, width = score.shape
    if width == 0 or budget == 0:
        return torch.full((groups, budget), -1, dtype=torch.int64, device=score.device)
    score[:, 0] = -torch.inf  # boundaries start at t = 1; a round with nothing left picks 0
    positions = torch.arange(width, device=score.device)  # [T]
    gap = gap.unsqueeze(1)  # [G, 1]
    picks = []
    for _ in range(budget):
        best = score.max(dim=1, keepdim=True).indices  # [G, 1]: the first maximum
        picks.append(best)
        score.masked_fill_((positions - best).abs_() < gap, -torch.inf)
    return ascending_used_first(torch.cat(picks, dim=1))  # picks: 0 where unused


def ascending_used_first(positions: torch.Tensor) -> torch.Tensor:
    """``positions [G, B]`` sorted ascending with the unused entries (``<= 0``) last, as ``-1``."""
    unused = torch.iinfo(torch.int64).max
    ordered = torch.where(positions > 0, positions, unused).sort(dim=1).values
    return torch.where(ordered == unused, -1, ordered)
