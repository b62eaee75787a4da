"""LEAF: surprisal-chosen boundaries, exact prefix nodes, span credit (spec, ``leaf``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.machinery.boundary_scan import greedy_boundaries, separation, shortest_lengths
from leaf_plugins.estimators.machinery.group_stats import group_extreme
from leaf_plugins.estimators.machinery.nodes import boundary_nodes
from leaf_plugins.estimators.machinery.span_credit import span_advantages

__all__ = ["LEAF", "LeafParams", "BudgetParams", "NodeParams", "HorizonParams", "SpanCreditParams",
           "surprisal_boundaries"]

# LEAF's parameters, one small dataclass per stage that reads them, so that the estimators
# that share a stage share its parameters (names, types, defaults, help and checks). Each
# ``__post_init__`` checks its own fields, then hands on to the next class of the instance's MRO.


@dataclass(frozen=True)
class BudgetParams:
    """B, the boundary budget (``leaf``, ``collision``, ``tree_rloo``, ``tree_otb``)."""

    fork_budget: int = field(default=2, metadata={
        "help": "B: at most this many boundaries per group"})

    def __post_init__(self) -> None:
        if self.fork_budget < 0:
            raise ValueError(f"fork_budget must be an integer >= 0, got {self.fork_budget!r}")
        getattr(super(), "__post_init__", lambda: None)()


@dataclass(frozen=True)
class NodeParams:
    """m0, the retention threshold of prefix groups (every prefix-tree estimator)."""

    min_group: int = field(default=2, metadata={
        "help": "m0: a prefix group becomes a node when it has at least this many responses"})

    def __post_init__(self) -> None:
        if self.min_group < 2:
            raise ValueError(f"min_group must be an integer >= 2 (singletons are never nodes), got {self.min_group!r}")
        getattr(super(), "__post_init__", lambda: None)()


@dataclass(frozen=True)
class HorizonParams:
    """Where LEAF's surprisal boundaries may lie (``leaf``, ``tree_rloo``, ``tree_otb``)."""

    horizon: Literal["shortest", "each"] = field(default="shortest", metadata={
        "help": "shortest: boundary candidates 1 <= t < the group's shortest length (the paper); each: "
                "t < the response's own length (the authors' code)"})


@dataclass(frozen=True)
class SpanCreditParams:
    """What the span credit adds up and how it is normalised (``leaf``, ``collision``, ``full_tree``)."""

    terms: Literal["both", "global", "local"] = field(default="both", metadata={
        "help": "both: GA + LA; global: GA only (r - V0); local: LA only (the node-to-node differences)"})
    normalize: Literal["none", "span", "token", "batch"] = field(default="span", metadata={
        "help": "span: z-score the raw advantages per group over its spans (one entry each); token: over "
                "the group's tokens; batch: over all tokens of the batch; none: not at all"})


@dataclass(frozen=True)
class LeafParams(SpanCreditParams, HorizonParams, NodeParams, BudgetParams):
    """LEAF's parameters: B, m0, the horizon of its boundaries and its span credit."""


class LEAF:
    """LEAF: at most B high-surprisal boundaries, prefix groups there, GA+LA span credit."""

    parameters = LeafParams

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
