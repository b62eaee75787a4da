"""Collision-only matching: LEAF with boundaries chosen by prefix-collision mass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries
from leaf_plugins.estimators.leaf import LEAF
from leaf_plugins.estimators.machinery.boundary_scan import separation, shortest_lengths
from leaf_plugins.estimators.parameters import BudgetParams, NodeParams, SpanCreditParams

__all__ = ["Collision", "CollisionParams", "collision_boundaries"]


@dataclass(frozen=True)
class CollisionParams(SpanCreditParams, NodeParams, BudgetParams):
    """LEAF's parameters without the horizon (its boundaries do not read surprisal)."""


class Collision(LEAF):
    """Collision-only matching: boundaries of largest prefix-collision mass, LEAF credit."""

    parameters = CollisionParams
    requires = ()  # boundaries from the tokens alone

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: BudgetParams) -> Boundaries:
        return Boundaries(collision_boundaries(shortest_lengths(batch), params.fork_budget))


@torch.inference_mode()
def collision_boundaries(shortest: torch.Tensor, budget: int) -> torch.Tensor:
    """``[G, B]`` boundaries of the greedy scan in descending collision mass.

    The spec scans ``1 <= p < lmin`` in descending κ(p) = Σ_u (n(p, u) / K)² (ties: smaller
    p first) under the separation Δ. Prefix classes at ``p + 1`` refine those at ``p``,
    so κ is non-increasing in p (the paper's Theorem 3). The scan therefore accepts
    ``p = 1`` first, and after each accepted ``p`` the best position left is ``p + Δ``:
    the result is ``1, 1 + Δ, 1 + 2Δ, …`` below lmin, whatever the tokens are. This is
    exactly the spec's scan, without computing κ.
    """
    gap = separation(shortest, budget)  # [G]
    steps = torch.arange(budget, device=shortest.device)  # [B]
    positions = 1 + steps.unsqueeze(0) * gap.unsqueeze(1)  # [G, B]
    return torch.where(positions < shortest.unsqueeze(1), positions, -1)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("collision", Collision())
