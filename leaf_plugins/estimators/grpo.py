"""GRPO: one group-normalised reward advantage broadcast to every token."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.params import EstimatorParams
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.group_stats import group_mean, group_std


class GRPO:
    """GRPO: (r_i - mean) / (max(std, std_floor) + eps), broadcast to every token."""

    parameters = frozenset({"std_floor", "eps"})

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: EstimatorParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: EstimatorParams) -> Nodes:
        return root_only_nodes(batch)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
        per_response = _normalised_rewards(batch, nodes, params)  # [N]
        return torch.where(batch.mask, per_response.unsqueeze(1), 0.0)  # [N, T]


@torch.inference_mode()
def _normalised_rewards(batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
    """``[N]`` float32 (r_i - V0) / (max(std, std_floor) + eps) per response."""
    layout = batch.groups
    rewards = batch.rewards.to(torch.float64)  # [N]
    std = group_std(rewards, layout.index, layout.count, layout.sizes, nodes.root_value.double())
    scale = std.clamp(min=params.std_floor) + params.eps  # [G]
    return ((rewards - nodes.root_value.double()[layout.index]) / scale[layout.index]).float()


@torch.inference_mode()
def root_only_nodes(batch: RolloutBatch) -> Nodes:
    """No retained node; only the group means (root values)."""
    layout = batch.groups
    device = batch.device
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    root = group_mean(batch.rewards.double(), layout.index, layout.count, layout.sizes).float()  # [G]
    return Nodes(
        group=empty,
        position=empty,
        value=torch.zeros(0, dtype=torch.float32, device=device),
        size=empty,
        path=torch.full((batch.size, 0), -1, dtype=torch.int64, device=device),
        root_value=root,
    )


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("grpo", GRPO())
