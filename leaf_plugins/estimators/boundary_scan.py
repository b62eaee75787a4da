"""Greedy boundary selection under the separation rule, for every group at once."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch

__all__ = ["separation", "shortest_lengths", "greedy_boundaries"]


def shortest_lengths(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` int64: the shortest response length lmin of every group."""
    layout = batch.groups
    if layout.uniform_size:
        return batch.lengths.view(layout.count, layout.uniform_size).amin(dim=1)
    out = torch.full((layout.count,), batch.width, dtype=torch.int64, device=batch.device)
    return out.scatter_reduce(0, layout.index, batch.lengths, reduce="amin", include_self=True)


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
    chosen = torch.cat(picks, dim=1)  # [G, B], 0 where unused
    chosen = chosen.masked_fill_(chosen == 0, width).sort(dim=1).values
    return chosen.masked_fill_(chosen == width, -1)
