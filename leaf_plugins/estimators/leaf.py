"""LEAF: surprisal-chosen boundaries, exact prefix nodes, span credit (spec, ``leaf``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.machinery.boundary_scan import greedy_boundaries, separation, shortest_lengths
from leaf_plugins.estimators.machinery.group_stats import group_extreme
from leaf_plugins.estimators.machinery.nodes import boundary_nodes
from leaf_plugins.estimators.machinery.span_credit import span_advantages
from leaf_plugins.estimators.parameters import BudgetParams, HorizonParams, NodeParams, SpanCreditParams

__all__ = ["LEAF", "LeafParams", "surprisal_boundaries"]

@dataclass(frozen=True)
class LeafParams(SpanCreditParams, HorizonParams, NodeParams, BudgetParams):
    """LEAF's parameters: B, m0, the horizon of its boundaries and its span credit."""


class LEAF:
    """LEAF: at most B high-surprisal boundaries, prefix groups there, GA+LA span credit."""

    parameters = LeafParams
    requires = {"select_boundaries": ("surprisal",)}  # the span credit reads tokens and rewards only

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: LeafParams) -> Boundaries:
        return Boundaries(surprisal_boundaries(batch, params.fork_budget, params.horizon))

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: NodeParams) -> Nodes:
        return boundary_nodes(batch, boundaries.positions, params.min_group)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: SpanCreditParams) -> torch.Tensor:
        return span_advantages(batch, nodes, params)


@torch.inference_mode()
def surprisal_boundaries(batch: RolloutBatch, budget: int, horizon: str) -> torch.Tensor:
    """``[G, B]`` LEAF boundaries (spec, step 1), in the order the scan accepts them,
    ``0`` where unused (``Boundaries`` sorts them).

    A position's score is the largest surprisal any response of the group has there:
    the scan meets a position first through that candidate, and every later candidate at
    the same position is rejected by the separation rule.
    """
    if batch.surprisal is None:
        raise ConfigError("LEAF selects boundaries by surprisal, but the batch has none: pass surprisal= "
                          "to RolloutBatch (one value per token, -log pi_old of the sampled token)")
    layout = batch.groups
    shortest = shortest_lengths(batch)  # [G]
    positions = torch.arange(batch.width, device=batch.device)
    if horizon == "shortest":  # every candidate lies inside every response of its group
        reach = int(shortest.max()) if layout.count else 0
        score = group_extreme(batch.surprisal[:, :reach], layout, "amax", empty=-torch.inf)  # [G, R]
        score.masked_fill_(positions[:reach] >= shortest.unsqueeze(1), -torch.inf)
    else:
        reach = int(batch.lengths.max()) if batch.size else 0
        inside = positions[:reach].float() < batch.lengths.float().unsqueeze(1)  # [N, R] (float compare: vectorised)
        candidates = torch.where(inside, batch.surprisal[:, :reach], -torch.inf)  # [N, R]
        score = group_extreme(candidates, layout, "amax", empty=-torch.inf)  # [G, R]
    return greedy_boundaries(score, separation(shortest, budget), budget)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("leaf", LEAF())
