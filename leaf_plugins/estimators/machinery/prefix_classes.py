"""Exact prefix classes at each group's boundaries, for the whole batch at once.

Responses ``i`` and ``j`` of a group are in one class at boundary ``p`` iff their first
``p`` tokens are equal (spec, LEAF step 2). Classes are proposed by comparing the
prefix hashes inside every group, a ``[G, B, K, K]`` comparison (B is the small fork
budget), and then *proved*: every response that is not the first member of its class is
compared with that first member up to its deepest such boundary, on the running hashes,
which agree on a prefix exactly when the tokens do. That one comparison per response
proves every class exact, by induction over the members in slot order: the partner is
an earlier member of the response's class at every shallower boundary too. Equal
prefixes always hash equal, so hashes can only merge classes wrongly; when the proof
finds that (never observed), the classes are recomputed from an exact lexicographic
sort of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes, compact_hashes, first_difference
from leaf_plugins.estimators.machinery.scratch import scratch

__all__ = ["PrefixClasses"]


@dataclass(frozen=True)
class PrefixClasses:
    """Prefix classes of every group member (the slots of ``batch.groups.members``) at
    every boundary.

    Where a slot is padding or a boundary unused (``p <= 0``) the slot is in no class:
    ``size`` is 0 there.
    """

    first: torch.Tensor  # [G, B, K] int64: slot of the first member of the slot's class
    size: torch.Tensor  # [G, B, K] int64: members of the slot's class
    reward_sum: torch.Tensor  # [G, B, K] float64: their summed reward

    @classmethod
    @torch.inference_mode()
    def at_boundaries(cls, batch: RolloutBatch, positions: torch.Tensor) -> "PrefixClasses":
        """The exact prefix classes at ``positions [G, B]`` (``-1`` or 0: unused)."""
        reach = max(int(positions.max()), 1) if positions.numel() else 1
        hashes = compact_hashes(batch.tokens[:, :reach], batch.token_bound)  # [N, R] int32 where token ids allow
        classes = cls._from_keys(batch, _hashes_at(hashes, batch, positions), positions)
        if classes._proven_on(hashes, batch, positions):
            return classes
        return cls._from_keys(batch, _keys_from_order(batch, positions, SortedPrefixes.lexicographic_exact(batch)),
                              positions)

    @classmethod
    @torch.inference_mode()
    def from_order(cls, batch: RolloutBatch, positions: torch.Tensor, prefixes: SortedPrefixes) -> "PrefixClasses":
        """The exact prefix classes at ``positions [G, B]`` read off the batch's
        lexicographic order ``prefixes`` (no hashing: for a caller that has the order)."""
        return cls._from_keys(batch, _keys_from_order(batch, positions, prefixes), positions)

    @classmethod
    def _from_keys(cls, batch: RolloutBatch, keys: torch.Tensor, positions: torch.Tensor) -> "PrefixClasses":
        """Classes of equal ``keys [G, B, K]`` among the real slots at used boundaries."""
        layout = batch.groups
        members = layout.members  # [G, K]
        inside = (positions > 0).unsqueeze(2)  # [G, B, 1]
        if layout.uniform_size:
            rewards = batch.rewards.double().view(members.shape)  # [G, K]
            same = (keys.unsqueeze(3) == keys.unsqueeze(2)) & inside.unsqueeze(3)  # [G, B, K, K]
        else:
            rewards = torch.where(members >= 0, batch.rewards.double()[members.clamp(min=0)], 0.0)
            inside = inside & (members >= 0).unsqueeze(1)  # [G, B, K]
            same = (keys.unsqueeze(3) == keys.unsqueeze(2)) & inside.unsqueeze(3) & inside.unsqueeze(2)
        if same.shape[3] == 0:  # no responses
            empty = torch.zeros(keys.shape, dtype=torch.int64, device=keys.device)
            return cls(first=empty, size=empty, reward_sum=empty.double())
        return cls(
            first=same.view(torch.uint8).max(dim=3).indices,  # the first of equal maxima
            size=same.sum(dim=3),
            reward_sum=(same * rewards.unsqueeze(1).unsqueeze(1)).sum(dim=3),
        )

    def _proven_on(self, hashes: torch.Tensor, batch: RolloutBatch, positions: torch.Tensor) -> bool:
        """Compare every slot that is not first in its class with that first member up to
        its deepest such boundary, on the running ``hashes [N, W]`` (equal exactly where
        the tokens are); ``True`` if all of them agree.
        """
        if positions.numel() == 0:  # no boundary: every slot is in no class
            return True
        layout = batch.groups
        members = layout.members  # [G, K]
        later = (self.size > 0) & (self.first != torch.arange(members.shape[1], device=members.device))  # [G, B, K]
        depth, deepest = torch.where(later, positions.unsqueeze(2), 0).max(dim=1)  # [G, K]: 0 = nothing to check
        reach = int(depth.max())
        if reach == 0:
            return True
        partner = members.gather(1, self.first.gather(1, deepest.unsqueeze(1)).squeeze(1))  # [G, K]
        rows = hashes[:, :reach]  # [N, R']
        if layout.uniform_size:  # slot order is row order
            right = scratch("partner rows", rows.shape, rows.dtype, rows.device)
            left, right, depth = rows, torch.index_select(rows, 0, partner.view(-1), out=right), depth.view(-1)
        else:
            real = members >= 0
            left, right, depth = rows.index_select(0, members[real]), rows.index_select(0, partner[real]), depth[real]
        return not bool((first_difference(left, right) < depth).any())  # [M] first column that differs


def _hashes_at(hashes: torch.Tensor, batch: RolloutBatch, positions: torch.Tensor) -> torch.Tensor:
    """``[G, B, K]`` hash of every slot's first ``p`` tokens, from the running ``hashes
    [N, W]``, a contiguous tensor (anything at unused boundaries and padding slots)."""
    members = batch.groups.members.clamp(min=0)  # [G, K]
    width = hashes.shape[1]
    if width == 0:  # empty responses only
        return torch.zeros(positions.shape + members.shape[1:], dtype=hashes.dtype, device=batch.device)
    column = (positions - 1).clamp_(min=0, max=width - 1)  # [G, B]
    return hashes.take((members * width).unsqueeze(1) + column.unsqueeze(2))  # [G, B, K]


def _keys_from_order(batch: RolloutBatch, positions: torch.Tensor, prefixes: SortedPrefixes) -> torch.Tensor:
    """``[G, B, K]`` int64 exact class id of every slot, from the lexicographic order
    ``prefixes`` (exact up to the batch's width)."""
    classes = prefixes.classes_at(positions.clamp(min=0))  # [N, B] over sorted responses
    per_row = torch.empty_like(classes)
    per_row[prefixes.order] = classes
    return per_row[batch.groups.members.clamp(min=0)].transpose(1, 2)
