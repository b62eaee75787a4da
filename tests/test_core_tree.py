"""The tables the estimator stages hand to each other."""

from __future__ import annotations

import torch

import leaf_plugins as lp
from leaf_plugins.core.tree import Boundaries


def test_boundaries_are_kept_ascending_with_unused_last():
    """A stage may return positions in any order, with 0 or negative entries unused."""
    boundaries = Boundaries(torch.tensor([[9, 0, 4], [-1, -1, -1], [0, 7, -3], [5, 2, 3]]))
    assert boundaries.positions.tolist() == [[4, 9, -1], [-1, -1, -1], [7, -1, -1], [2, 3, 5]]
    assert boundaries.to_lists() == [[4, 9], [], [7], [2, 3, 5]]
    assert Boundaries.empty(2, torch.device("cpu")).positions.shape == (2, 0)


class _UnsortedLEAF:
    """LEAF, except that its boundaries come back in reverse order (0 for unused)."""

    def __init__(self, leaf):
        self.leaf = leaf

    @lp.hookimpl
    def select_boundaries(self, batch, params):
        return Boundaries(self.leaf.select_boundaries(batch, params).positions.clamp(min=0).flip(1))


def test_a_stage_returning_unsorted_boundaries_gets_the_same_nodes():
    """Retention reads the boundaries ascending, whatever order a stage produced."""
    tokens = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 7, 7, 7], [1, 8, 8, 8, 8, 8]]
    surprisal = [[0.1, 3.0, 0.2, 0.1, 2.5, 0.1], [0.1, 0.2, 0.3, 0.1, 0.2, 0.1], [0.1, 0.1, 0.1, 0.1, 0.1],
                 [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]]
    batch = lp.RolloutBatch.from_lists(tokens, [1.0, 0.0, 0.5, 0.2], [0, 0, 0, 0], surprisal=surprisal)
    plain = lp.estimate(batch, "leaf", fork_budget=3)
    engine = lp.Engine("leaf", {"fork_budget": 3})
    engine.manager.register(_UnsortedLEAF(lp.Engine("leaf").manager.get_plugin("estimator:leaf")), name="unsorted")
    unsorted = engine.estimate(batch)
    assert len(plain.boundaries[0]) >= 2  # the reversal changes something
    assert unsorted.boundaries == plain.boundaries
    assert unsorted.nodes == plain.nodes
    assert torch.equal(unsorted.advantages, plain.advantages)
