"""Tree RLOO: prefix leave-one-out baselines on the retained nodes (unbiased)."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.leaf import LEAF
from leaf_plugins.estimators.machinery.group_stats import per_response
from leaf_plugins.estimators.machinery.node_shrinkage import group_scale, node_shrink
from leaf_plugins.estimators.machinery.tree_baselines import path_baselines
from leaf_plugins.estimators.parameters import TreeRLOOParams

__all__ = ["TreeRLOO"]


class TreeRLOO(LEAF):
    """Tree RLOO: r_i minus the mean reward of the others that share i's prefix (unbiased)."""

    parameters = TreeRLOOParams  # requires: LEAF's (surprisal for its boundaries)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: TreeRLOOParams) -> torch.Tensor:
        baselines = path_baselines(batch, nodes, node_shrink(batch, nodes, params))
        with torch.inference_mode():
            scale = per_response(group_scale(batch, params), batch.groups).unsqueeze(1)  # [N, 1]
            segments = (batch.rewards.double().unsqueeze(1) - baselines.values) / scale  # [N, D+1]
        return baselines.paint(segments.float(), batch.width)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_rloo", TreeRLOO())
