"""Per-group statistics of per-response values, without a Python loop over groups.

Uniform layouts (every group K consecutive responses, as rollouts produce them) reduce
a ``[G, K, ...]`` view; other layouts scatter by group number.
"""

from __future__ import annotations

import math

import torch

from leaf_plugins.core.batch import GroupLayout, RolloutBatch, group_mean, group_sum

__all__ = ["group_total", "group_std", "pooled_std", "group_extreme", "per_response", "by_group", "root_values"]


def group_total(values: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Sum of ``values [N, ...]`` over each group's responses and all other dimensions
    -> ``[G]``."""
    if layout.uniform_size:
        return values.reshape(layout.count, layout.uniform_size * math.prod(values.shape[1:])).sum(dim=1)
    return group_sum(values.reshape(values.shape[0], math.prod(values.shape[1:])).sum(dim=1), layout)


def group_std(values: torch.Tensor, layout: GroupLayout, mean: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation (n - 1) of ``values [N]`` per group around ``mean [G]``
    -> ``[G]``; 0 for groups of fewer than two values."""
    centred = values - per_response(mean, layout)  # [N]
    square_sum = group_sum(centred * centred, layout)
    return (square_sum / (layout.sizes - 1).clamp(min=1).to(values.dtype)).sqrt_() * (layout.sizes > 1)


def pooled_std(values: torch.Tensor, layout: GroupLayout, mean: torch.Tensor) -> torch.Tensor:
    """The within-group standard deviation of ``values [N]`` pooled over the groups,
    ``sqrt(Σ_g Σ_i (v_i − mean_g)² / Σ_g (n_g − 1))`` around ``mean [G]`` -> a 0-d
    tensor; 0 when no group has two values."""
    centred = values - per_response(mean, layout)  # [N]
    freedom = (layout.sizes - 1).clamp(min=0).sum().clamp(min=1).to(values.dtype)
    return ((centred * centred).sum() / freedom).sqrt()


def group_extreme(values: torch.Tensor, layout: GroupLayout, reduce: str, empty: float) -> torch.Tensor:
    """Largest (``reduce="amax"``) or smallest (``"amin"``) of ``values [N, ...]`` over
    each group's responses -> ``[G, ...]``, a new tensor; ``empty`` for a group without
    responses."""
    if layout.uniform_size:
        return getattr(values.unflatten(0, (layout.count, layout.uniform_size)), reduce)(dim=1)
    out = torch.full((layout.count,) + values.shape[1:], empty, dtype=values.dtype, device=values.device)
    index = layout.index.view((-1,) + (1,) * (values.dim() - 1)).expand_as(values)
    return out.scatter_reduce_(0, index, values, reduce=reduce)


def per_response(values: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Each response's entry of per-group ``values [G, ...]`` -> ``[N, ...]``."""
    return values.index_select(0, layout.index)


def by_group(values: torch.Tensor, per_group: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """``values [N, ...]`` and ``per_group [G, ...]`` shaped so that an elementwise (in-place)
    operation between them pairs every response with its group's entry: a ``[G, K, ...]``
    view of ``values`` and ``[G, 1, ...]`` where every group has ``K`` contiguous responses
    (no ``[N, ...]`` copy of ``per_group``), else ``values`` and ``per_response(per_group)``."""
    if layout.uniform_size:
        return values.unflatten(0, (layout.count, layout.uniform_size)), per_group.unsqueeze(1)
    return values, per_response(per_group, layout)


def root_values(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` float32 mean reward of every group (the root value V0)."""
    return group_mean(batch.rewards.double(), batch.groups).float()
