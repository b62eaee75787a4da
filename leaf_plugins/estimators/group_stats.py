"""Per-group statistics of flat values, without a Python loop over groups."""

from __future__ import annotations

import torch

__all__ = ["group_sum", "group_mean", "group_std"]


def group_sum(values: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
    """Sum of ``values [M]`` per group ``index [M]`` -> ``[groups]`` (float32 or float64)."""
    out = torch.zeros(groups, dtype=values.dtype, device=values.device)
    return out.index_add_(0, index, values)


def group_mean(values: torch.Tensor, index: torch.Tensor, groups: int, counts: torch.Tensor) -> torch.Tensor:
    """Mean of ``values [M]`` per group -> ``[groups]``; 0 for an empty group."""
    return group_sum(values, index, groups) / counts.clamp(min=1).to(values.dtype)


def group_std(
    values: torch.Tensor, index: torch.Tensor, groups: int, counts: torch.Tensor, mean: torch.Tensor
) -> torch.Tensor:
    """Sample standard deviation (n - 1) per group -> ``[groups]``; 0 for groups of
    fewer than two values."""
    centred = values - mean[index]  # [M]
    square_sum = group_sum(centred * centred, index, groups)
    return (square_sum / (counts - 1).clamp(min=1).to(values.dtype)).sqrt() * (counts > 1)
