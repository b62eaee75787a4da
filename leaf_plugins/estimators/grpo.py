"""GRPO: one group-normalised reward advantage broadcast to every token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes, root_only_nodes
from leaf_plugins.estimators.machinery.group_stats import group_std, per_response
from leaf_plugins.estimators.parameters import GRPOParams

__all__ = ["GRPO", "GRPOEstimatorParams"]


@dataclass(frozen=True)
class GRPOEstimatorParams(GRPOParams):
    """GRPO's own parameters: the normalisation of the rewards, and whether to divide by
    the group's std at all."""

    scale_rewards: bool = field(default=True, metadata={
        "help": "divide by the group's reward std (false: Dr. GRPO's unscaled r_i - mean)"})


class GRPO:
    """GRPO: (r_i - mean) / (max(std, std_floor) + eps), broadcast to every token;
    ``scale_rewards: false`` (Dr. GRPO) leaves out the division."""

    parameters = GRPOEstimatorParams
    requires = ()  # rewards only

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: GRPOParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: GRPOParams) -> Nodes:
        return root_only_nodes(batch)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: GRPOEstimatorParams) -> torch.Tensor:
        advantage = _normalised_rewards(batch, nodes, params)  # [N]
        return torch.where(batch.mask, advantage.unsqueeze(1), 0.0)  # [N, T]


@torch.inference_mode()
def _normalised_rewards(batch: RolloutBatch, nodes: Nodes, params: GRPOEstimatorParams) -> torch.Tensor:
    """``[N]`` float32 (r_i - V0) / (max(std, std_floor) + eps) per response (without the
    division when ``params.scale_rewards`` is false)."""
    layout = batch.groups
    rewards = batch.rewards.to(torch.float64)  # [N]
    root = nodes.root_value.double()  # [G]
    centred = rewards - per_response(root, layout)  # [N]
    if not params.scale_rewards:
        return centred.float()
    scale = group_std(rewards, layout, root).clamp(min=params.std_floor) + params.eps  # [G]
    return (centred / per_response(scale, layout)).float()


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("grpo", GRPO())
