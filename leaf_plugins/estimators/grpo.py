"""GRPO: one group-normalised reward advantage broadcast to every token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.machinery.group_stats import group_std, per_response, root_values


@dataclass(frozen=True)
class GRPOParams:
    """GRPO's normalisation of the rewards (also ``tree_rloo``'s and ``tree_otb``'s)."""

    std_floor: float = field(default=0.0, metadata={
        "help": "floor (>= 0) of the group's reward std before dividing by it"})
    eps: float = field(default=1e-6, metadata={"help": "added to the divisor (> 0)"})

    def __post_init__(self) -> None:
        if not self.std_floor >= 0:
            raise ValueError(f"std_floor must be a number >= 0, got {self.std_floor!r}")
        if not self.eps > 0:
            raise ValueError(f"eps must be a number > 0, got {self.eps!r}")
        getattr(super(), "__post_init__", lambda: None)()


class GRPO:
    """GRPO: (r_i - mean) / (max(std, std_floor) + eps), broadcast to every token."""

    parameters = GRPOParams

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: GRPOParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: GRPOParams) -> Nodes:
        return root_only_nodes(batch)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: GRPOParams) -> torch.Tensor:
        advantage = _normalised_rewards(batch, nodes, params)  # [N]
        return torch.where(batch.mask, advantage.unsqueeze(1), 0.0)  # [N, T]


@torch.inference_mode()
def _normalised_rewards(batch: RolloutBatch, nodes: Nodes, params: GRPOParams) -> torch.Tensor:
    """``[N]`` float32 (r_i - V0) / (max(std, std_floor) + eps) per response."""
    layout = batch.groups
    rewards = batch.rewards.to(torch.float64)  # [N]
    root = nodes.root_value.double()  # [G]
    scale = group_std(rewards, layout, root).clamp(min=params.std_floor) + params.eps  # [G]
    return ((rewards - per_response(root, layout)) / per_response(scale, layout)).float()


@torch.inference_mode()
def root_only_nodes(batch: RolloutBatch) -> Nodes:
    """No retained node; only the group means (root values)."""
    device = batch.device
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return Nodes(
        group=empty,
        position=empty,
        value=torch.zeros(0, dtype=torch.float32, device=device),
        size=empty,
        path=torch.full((batch.size, 0), -1, dtype=torch.int64, device=device),
        root_value=root_values(batch),
    )


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("grpo", GRPO())
