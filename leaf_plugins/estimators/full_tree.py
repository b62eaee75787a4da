"""Full prefix tree (TreeRL-style, retrospective): every branching set is a node."""

from __future__ import annotations

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.params import EstimatorParams
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.leaf import LEAF
from leaf_plugins.estimators.machinery.nodes import trie_nodes
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

__all__ = ["FullTree"]


class FullTree(LEAF):
    """Full prefix tree: every branching set of the exact-match trie, no budget."""

    parameters = frozenset({"min_group", "terms", "normalize"})

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: EstimatorParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: EstimatorParams) -> Nodes:
        return trie_nodes(batch, SortedPrefixes.lexicographic(batch), params.min_group)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("full_tree", FullTree())
