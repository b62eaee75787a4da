"""Greedy boundary selection under the separation rule, for every group at once."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch

__all__ = ["separation", "shortest_lengths", "greedy_boundaries"]


def shortest_lengths(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` int64: the shortest response length lmin of every group."""
    layout = batch.groups
    out = torch.full((layout.count,), batch.width, dtype=torch.int64, device=batch.device)
    return out.scatter_reduce(0, layout.index, batch.lengths, reduce="amin", include_self=True)


def separation(shortest: torch.Tensor, budget: int) -> torch.Tensor:
    """``[G]`` int64: the minimum distance Δ = max(2, floor(lmin / (B + 1)))."""
    return torch.clamp(torch.div(shortest, budget + 1, rounding_mode="floor"), min=2)


def greedy_boundaries(score: torch.Tensor, admissible: torch.Tensor, gap: torch.Tensor, budget: int) -> torch.Tensor:
    """Scan positions in descending score (ties: smaller position first) and accept a
    position when it lies at least ``gap`` from every accepted one, up to ``budget``.

    Taking, ``budget`` times, the best admissible position not within ``gap`` of an
    accepted one is the same as the sequential scan, since accepting only adds exclusions.

    :param score: ``[G, T]`` float score per position.
    :param admissible: ``[G, T]`` bool, positions that may be chosen.
    :param gap: ``[G]`` int64 separation Δ per group.
    :return: ``[G, budget]`` int64 accepted positions, ascending, ``-1`` where unused.
    """
    groups, width = score.shape
    chosen = torch.full((groups, budget), -1, dtype=torch.int64, device=score.device)
    if width == 0 or budget == 0:
        return chosen
    positions = torch.arange(width, device=score.device)  # [T]
    lowest = torch.finfo(score.dtype).min
    working = score.masked_fill(~admissible, lowest)  # [G, T]: excluded positions hold `lowest`
    low_side, high_side = positions - gap.unsqueeze(1), positions + gap.unsqueeze(1)  # [G, T]
    for round_ in range(budget):
        best = working.argmax(dim=1, keepdim=True)  # [G, 1]
        found = working.gather(1, best) > lowest  # [G, 1]
        chosen[:, round_] = torch.where(found, best, -1).squeeze(1)
        # |t - best| < gap  <=>  t - gap < best < t + gap
        working.masked_fill_((low_side < best) & (best < high_side), lowest)
    unused = chosen < 0
    ordered = torch.where(unused, width, chosen).sort(dim=1).values
    return torch.where(ordered >= width, -1, ordered)
