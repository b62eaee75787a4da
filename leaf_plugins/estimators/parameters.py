"""The parameter dataclasses the built-in estimators share, one small dataclass per
stage that reads them: estimators that share a stage share its parameters (names, types,
defaults, help and checks). Each ``__post_init__`` checks its own fields, then hands on to
the next class of the instance's MRO."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["BudgetParams", "NodeParams", "HorizonParams", "SpanCreditParams", "GRPOParams", "TreeRLOOParams"]


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
