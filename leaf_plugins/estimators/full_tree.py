"""Full prefix tree (TreeRL-style, retrospective): every branching set is a node."""

from __future__ import annotations

from dataclasses import dataclass

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.leaf import LEAF
from leaf_plugins.estimators.machinery.nodes import trie_nodes
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes
from leaf_plugins.estimators.parameters import NodeParams, SpanCreditParams

__all__ = ["FullTree", "FullTreeParams"]


@dataclass(frozen=True)
class FullTreeParams(SpanCreditParams, NodeParams):
    """m0 and LEAF's span credit (no budget: every branching set is a node)."""


class FullTree(LEAF):
    """Full prefix tree: every branching set of the exact-match trie, no budget."""

    parameters = FullTreeParams
    requires = ()  # the trie of the tokens

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: FullTreeParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: NodeParams) -> Nodes:
        return trie_nodes(batch, SortedPrefixes.of(batch), params.min_group)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("full_tree", FullTree())
