"""Tree RLOO: prefix leave-one-out baselines on the retained nodes (unbiased)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.machinery.group_stats import group_std, per_response, pooled_std, root_values
from leaf_plugins.estimators.grpo import GRPOParams
from leaf_plugins.estimators.leaf import LEAF, BudgetParams, HorizonParams, NodeParams
from leaf_plugins.estimators.machinery.node_shrinkage import node_shrink
from leaf_plugins.estimators.machinery.tree_baselines import path_baselines

__all__ = ["TreeRLOO", "TreeRLOOParams", "group_scale"]


@dataclass(frozen=True)
class TreeRLOOParams(GRPOParams, HorizonParams, NodeParams, BudgetParams):
    """LEAF's boundaries and nodes, GRPO's std floor and eps, and the node values' shrinkage and scale."""

    shrink: float | Literal["auto"] = field(default=4.0, metadata={
        "help": "prior weight (in responses) pulling a small node's leave-one-out value toward its parent's, "
                "or auto: learnt per group from the other groups' nodes"})
    scale: Literal["group_std", "batch_std", "none"] = field(default="group_std", metadata={
        "help": "group_std: divide the advantages by the group's reward std (as GRPO); batch_std: by one std "
                "pooled over the batch's groups; none: not at all"})

    def __post_init__(self) -> None:
        if self.shrink != "auto" and not (0 <= self.shrink < math.inf):
            raise ValueError(f"shrink must be a finite number >= 0 or 'auto', got {self.shrink!r}")
        super().__post_init__()


class TreeRLOO(LEAF):
    """Tree RLOO: r_i minus the mean reward of the others that share i's prefix (unbiased)."""

    parameters = TreeRLOOParams

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: TreeRLOOParams) -> torch.Tensor:
        baselines = path_baselines(batch, nodes, node_shrink(batch, nodes, params))
        with torch.inference_mode():
            scale = per_response(group_scale(batch, params), batch.groups).unsqueeze(1)  # [N, 1]
            segments = (batch.rewards.double().unsqueeze(1) - baselines.values) / scale  # [N, D+1]
        return baselines.paint(segments.float(), batch.width)


def group_scale(batch: RolloutBatch, params: TreeRLOOParams) -> torch.Tensor:
    """``[G]`` float64 divisor of the advantages: GRPO's ``max(std, std_floor) + eps``
    (sample std of the group's rewards) for ``scale="group_std"``; the same with the
    batch's within-group std pooled over its groups, one divisor for every group, for
    ``"batch_std"``; 1 for ``"none"``.

    ``batch_std`` keeps the advantages in units of the batch's reward spread, as GRPO's
    are, without weighing one group against another: the batch gradient keeps its
    direction, only its length changes from batch to batch. (With advantages in reward
    units, their size falls as a group's rewards draw together during training, and an
    optimizer with a long memory of past gradient sizes, as Adam's second moment, takes
    ever smaller steps.)

    Where ``max(std, std_floor)`` is 0 (an all-equal group; under ``batch_std``, a batch
    of all-equal groups) the divisor is ``inf``: the advantages are 0, as GRPO's, not
    ``(r − b) / eps`` for a baseline ``b`` that is not the group's mean (``tree_otb``'s)."""
    if params.scale == "none":
        return torch.ones(batch.groups.count, dtype=torch.float64, device=batch.device)
    rewards = batch.rewards.double()
    means = root_values(batch).double()  # [G]
    if params.scale == "batch_std":
        spread = pooled_std(rewards, batch.groups, means).clamp(min=params.std_floor).expand(batch.groups.count)
    else:
        spread = group_std(rewards, batch.groups, means).clamp(min=params.std_floor)  # [G]
    return torch.where(spread > 0, spread + params.eps, torch.inf)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_rloo", TreeRLOO())
