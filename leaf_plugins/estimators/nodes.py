"""Retained prefix nodes, as ``Nodes`` tables, from the sorted prefix structure."""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.group_stats import group_mean
from leaf_plugins.estimators.prefixes import SortedPrefixes, range_minima

__all__ = ["boundary_nodes", "trie_nodes", "root_values"]


def root_values(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` float32 mean reward of every group (the root value V0)."""
    layout = batch.groups
    return group_mean(batch.rewards.double(), layout.index, layout.count, layout.sizes).float()


@torch.inference_mode()
def boundary_nodes(batch: RolloutBatch, prefixes: SortedPrefixes, positions: torch.Tensor, min_group: int) -> Nodes:
    """Group responses by exact prefix at each selected boundary; groups of at least
    ``min_group`` members become nodes (spec, LEAF step 2).

    :param positions: ``[G, B]`` selected boundaries per group, ascending, ``-1`` unused.
    """
    n, budget = batch.size, positions.shape[1]
    classes = prefixes.classes_at(positions)  # [N, B] over sorted responses
    boundary = positions[prefixes.group]  # [N, B]
    used = boundary > 0
    flat = classes.reshape(-1)
    total = budget * max(n, 1)
    sizes = torch.bincount(flat, minlength=total)  # [B*N]
    sums = torch.zeros(total, dtype=torch.float64, device=batch.device).index_add_(
        0, flat, batch.rewards.double()[prefixes.order].repeat_interleave(budget)
    )
    opens = torch.ones_like(classes, dtype=torch.bool)
    opens[1:] = classes[1:] != classes[:-1]  # first sorted member of each class
    kept = opens & used & (sizes[classes] >= min_group)  # [N, B]
    kept_class = classes[kept]  # [M]
    node_of_class = torch.full((total,), -1, dtype=torch.int64, device=batch.device)
    node_of_class[kept_class] = torch.arange(kept_class.numel(), device=batch.device)
    path_sorted = torch.where(used, node_of_class[classes], -1)  # [N, B] ascending positions
    path = torch.empty_like(path_sorted)
    path[prefixes.order] = _compact_left(path_sorted)
    return Nodes(
        group=prefixes.group.unsqueeze(1).expand(n, budget)[kept],
        position=boundary[kept],
        value=(sums[kept_class] / sizes[kept_class]).float(),
        size=sizes[kept_class],
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


def _compact_left(path: torch.Tensor) -> torch.Tensor:
    """Move the ``-1`` entries of each row to its end, keeping the order of the rest."""
    if path.shape[1] < 2:
        return path
    key = (path < 0).to(torch.int64) * path.shape[1] + torch.arange(path.shape[1], device=path.device)
    return path.gather(1, key.argsort(dim=1))
