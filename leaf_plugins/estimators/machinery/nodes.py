"""Retained prefix nodes, as ``Nodes`` tables, from exact prefix classes."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.machinery.group_stats import root_values
from leaf_plugins.estimators.machinery.prefix_classes import PrefixClasses
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes, range_minima

__all__ = ["boundary_nodes", "trie_nodes"]


@torch.inference_mode()
def boundary_nodes(batch: RolloutBatch, positions: torch.Tensor, min_group: int,
                   prefixes: SortedPrefixes | None = None) -> Nodes:
    """Group responses by exact prefix at each selected boundary; groups of at least
    ``min_group`` members become nodes (spec, LEAF step 2).

    :param positions: ``[G, B]`` selected boundaries per group, ascending, ``-1`` where
        unused (``Boundaries.positions``).
    :param prefixes: the batch's lexicographic order, if the caller has it (the classes
        are then read off it); otherwise they are found by prefix hashes.
    """
    classes = (PrefixClasses.at_boundaries(batch, positions) if prefixes is None
               else PrefixClasses.from_order(batch, positions, prefixes))
    groups, budget, width = classes.size.shape
    slots = torch.arange(width, device=batch.device)
    # a node is recorded at its first member; min_group >= 2, so a response in a node
    # at one boundary is in one at every shallower boundary: paths end in -1 only
    kept = (classes.first == slots) & (classes.size >= min_group)  # [G, B, K]
    node_id = torch.cumsum(kept.view(-1), 0).view(groups, budget, width) - 1  # [G, B, K]
    path = torch.where(kept.gather(2, classes.first), node_id.gather(2, classes.first), -1).transpose(1, 2)  # [G, K, B]
    members = batch.groups.members  # [G, K]
    if batch.groups.uniform_size:
        path = path.reshape(batch.size, budget)
    else:
        path = torch.empty((batch.size, budget), dtype=torch.int64, device=batch.device).index_put_(
            (members[members >= 0],), path[members >= 0]
        )
    kept = kept.view(-1).nonzero().squeeze(1)  # [M] flat (group, boundary, slot) of every node
    size = classes.size.view(-1).index_select(0, kept)
    return Nodes(
        group=kept.div(budget * width, rounding_mode="floor"),
        position=positions.reshape(-1).index_select(0, kept.div(width, rounding_mode="floor")),
        value=(classes.reward_sum.view(-1).index_select(0, kept) / size).float(),
        size=size,
        path=path,
        root_value=root_values(batch),
    )


@torch.inference_mode()
def trie_nodes(batch: RolloutBatch, prefixes: SortedPrefixes, min_group: int) -> Nodes:
    """Every branching set of the compressed prefix trie with at least ``min_group``
    members, at the position where its members stop sharing their prefix (spec,
    ``full_tree``).

    Adjacent LCPs are capped at both lengths (a set's members stop sharing where one of
    them ends). A branching set is then a maximal run of sorted responses whose capped
    adjacent LCPs are all at least ``d``, ``d`` being the smallest of them; each set is
    found once, at the leftmost gap that attains its minimum. Identical responses thus
    share a set whose position is their length. Capping keeps range minima exact: a
    response sorted between two others is at least as long as their common prefix.
    """
    lengths = prefixes.per_group(batch.lengths[prefixes.order], 0)  # [G, K]
    gaps = prefixes.gap_matrix  # [G, K-1]
    depth = torch.where(gaps >= 0, torch.minimum(gaps, torch.minimum(lengths[:, :-1], lengths[:, 1:])), -1)
    spans = range_minima(depth)  # [G, K-1(a), K-1(k)]: min of capped gaps a..k
    groups, count = gaps.shape
    device = batch.device
    reach_left = (spans >= depth.unsqueeze(1)).sum(dim=1)  # [G, K-1]: a <= k with min(a..k) >= d_k
    reach_right = (spans >= depth.unsqueeze(2)).sum(dim=2)  # [G, K-1]: b >= k with min(k..b) >= d_k
    first_gap = torch.arange(count, device=device) - reach_left + 1  # [G, K-1]
    last_gap = torch.arange(count, device=device) + reach_right - 1
    previous = torch.cat([torch.full_like(spans[:, :, :1], -1), spans[:, :, :-1]], dim=2)  # min(a..k-1)
    strictly_left = (previous > depth.unsqueeze(1)).sum(dim=1)  # [G, K-1]
    leftmost = strictly_left == reach_left - 1  # no gap of value d_k left of k in its run
    members = last_gap - first_gap + 2  # [G, K-1]
    valid = (depth > 0) & leftmost & (members >= min_group)

    rewards = prefixes.per_group(batch.rewards.double()[prefixes.order], 0.0)  # [G, K]
    cumulative = torch.cat([torch.zeros_like(rewards[:, :1]), rewards.cumsum(dim=1)], dim=1)  # [G, K+1]
    total = cumulative.gather(1, (last_gap + 2).clamp(0, count + 1)) - cumulative.gather(1, first_gap.clamp(min=0))

    node_id = torch.cumsum(valid.reshape(-1).to(torch.int64), 0).reshape(groups, count) - 1  # [G, K-1]
    slots = torch.arange(prefixes.max_size, device=device)  # [K]
    contains = (
        valid.unsqueeze(1)
        & (first_gap.unsqueeze(1) <= slots.view(1, -1, 1))
        & (slots.view(1, -1, 1) <= last_gap.unsqueeze(1) + 1)
    )  # [G, K(slot), K-1(node)]
    big = torch.iinfo(torch.int64).max
    key = torch.where(contains, depth.unsqueeze(1), big)  # nested sets have strictly larger d
    ranked = key.sort(dim=2)
    chain = torch.where(ranked.values < big, node_id.unsqueeze(1).expand_as(key).gather(2, ranked.indices), -1)
    path = torch.empty((batch.size, count), dtype=torch.int64, device=device)
    path[prefixes.order] = chain[prefixes.group, prefixes.slot]
    return Nodes(
        group=torch.arange(groups, device=device).unsqueeze(1).expand(groups, count)[valid],
        position=depth[valid],
        value=(total[valid] / members[valid]).float(),
        size=members[valid],
        path=path,
        root_value=root_values(batch),
    )

