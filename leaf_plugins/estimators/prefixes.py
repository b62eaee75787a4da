"""Exact shared-prefix structure of every group, computed for the whole batch at once.

The responses of a batch are put in an order in which the members of every prefix class
that matters are contiguous within their group. Then two neighbours' longest common
prefix (LCP), found by one exact token comparison, decides everything: responses share
their first ``p`` tokens iff every adjacent LCP between them is at least ``p``.

Finding that order by comparing whole rows is slow when responses share long prefixes,
so it is proposed from 64-bit float prefix hashes and then *checked exactly* on the
tokens; in the (never observed) event of a hash collision the exact check fails and the
order is recomputed by a plain lexicographic sort of the rows. Results are exact either
way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from leaf_plugins.core.batch import RolloutBatch

__all__ = ["SortedPrefixes", "range_minima"]


@dataclass(frozen=True)
class SortedPrefixes:
    """Responses in a group-contiguous order with the LCP of adjacent responses.

    ``lcp`` is exact up to ``reach``: an adjacent pair that shares at least ``reach``
    tokens (identical rows included) has ``lcp == reach``.
    """

    order: torch.Tensor  # [N] int64: batch index of the k-th response in sorted order
    group: torch.Tensor  # [N] int64: group number of the k-th sorted response
    lcp: torch.Tensor  # [N] int64: LCP with the previous sorted response, -1 at a group's first
    slot: torch.Tensor  # [N] int64: rank of the k-th sorted response within its group
    sizes: torch.Tensor  # [G] int64: group sizes
    reach: int  # LCPs are exact up to this length

    # ------------------------------------------------------------------ construction
    @classmethod
    @torch.inference_mode()
    def at_boundaries(cls, batch: RolloutBatch, positions: torch.Tensor) -> "SortedPrefixes":
        """An order in which the prefix classes at the given boundaries are contiguous.

        :param positions: ``[G, B]`` boundaries per group (``-1`` unused).
        """
        reach = max(int(positions.max()), 0) if positions.numel() else 0
        tokens = batch.tokens[:, :reach]  # [N, R]
        boundary = positions[batch.groups.index].clamp(min=0)  # [N, B]
        try:
            hashes = _prefix_hashes(tokens, batch.token_bound)  # [N, R]
        except OverflowError:
            return cls.lexicographic_exact(batch)
        keys = _hash_at(hashes, torch.arange(batch.size, device=batch.device).unsqueeze(1), boundary)  # [N, B]
        # rows with equal (group, key_1 … key_B) become neighbours; any order of the
        # distinct key rows will do, so the float64 hashes are sorted by their bit patterns
        keyed = torch.cat([batch.groups.index.unsqueeze(1), keys.view(torch.int64)], dim=1)  # [N, B+1]
        order = _lexicographic_order(keyed)  # [N]
        prefixes = cls._from_order(batch, order, tokens)
        group, lcp = prefixes.group, prefixes.lcp
        same = (group[1:] == group[:-1]).unsqueeze(1)  # [N-1, 1]
        sorted_keys, sorted_boundary = keys[order], boundary[order]
        hash_equal = sorted_keys[1:] == sorted_keys[:-1]  # [N-1, B]
        collision = same & hash_equal & (lcp[1:].unsqueeze(1) < sorted_boundary[1:])
        if bool(collision.any()):
            return cls.lexicographic_exact(batch)
        return prefixes

    @classmethod
    @torch.inference_mode()
    def lexicographic(cls, batch: RolloutBatch) -> "SortedPrefixes":
        """Responses in (group, lexicographic) order: every prefix class at every depth is
        contiguous (padding ``-1`` sorts before every token)."""
        layout = batch.groups
        try:
            hashes = _prefix_hashes(batch.tokens, batch.token_bound)  # [N, T]
        except OverflowError:
            return cls.lexicographic_exact(batch)
        members = _members(layout.index, layout.sizes)  # [G, K] batch index, -1 padded
        valid = members >= 0
        rows = members.clamp(min=0)
        left, right = rows.unsqueeze(2), rows.unsqueeze(1)  # [G, K, 1], [G, 1, K]
        shared = _hash_lcp(hashes, left, right)  # [G, K, K]
        left_next, right_next = _token_after(batch.tokens, left, shared), _token_after(batch.tokens, right, shared)
        slots = torch.arange(members.shape[1], device=batch.device)
        before = (right_next < left_next) | ((right_next == left_next) & (slots.view(1, 1, -1) < slots.view(1, -1, 1)))
        before &= valid.unsqueeze(1) & valid.unsqueeze(2)  # [G, K(a), K(b)]: b sorts before a
        rank = torch.where(valid, before.sum(dim=2), members.shape[1])  # [G, K]
        order = members.gather(1, rank.argsort(dim=1))[valid.sum(dim=1, keepdim=True) > slots]  # [N]
        prefixes = cls._from_order(batch, order, batch.tokens)
        if not prefixes._is_lexicographic(batch):
            return cls.lexicographic_exact(batch)
        return prefixes

    @classmethod
    @torch.inference_mode()
    def lexicographic_exact(cls, batch: RolloutBatch) -> "SortedPrefixes":
        """The (group, lexicographic) order by a direct sort of the rows (slow when
        responses share long prefixes; the fallback of the two methods above)."""
        keyed = torch.cat([batch.groups.index.unsqueeze(1), batch.tokens], dim=1)  # [N, T+1]
        _, rank = torch.unique(keyed, dim=0, sorted=True, return_inverse=True)  # [N]
        return cls._from_order(batch, torch.argsort(rank, stable=True), batch.tokens)

    @classmethod
    def _from_order(cls, batch: RolloutBatch, order: torch.Tensor, tokens: torch.Tensor) -> "SortedPrefixes":
        layout = batch.groups
        n, reach = batch.size, tokens.shape[1]
        group = layout.index[order]  # [N]
        lcp = torch.full((n,), -1, dtype=torch.int64, device=batch.device)
        if n > 1:
            ordered = tokens.index_select(0, order)  # [N, R]
            lcp[1:] = torch.where(group[1:] == group[:-1], _first_difference(ordered[:-1], ordered[1:]), -1)
        start = torch.cumsum(layout.sizes, 0) - layout.sizes  # [G]
        slot = torch.arange(n, device=batch.device) - start[group]  # [N]
        return cls(order, group, lcp, slot, layout.sizes, reach)

    def _is_lexicographic(self, batch: RolloutBatch) -> bool:
        """Exact check that each adjacent pair of a group is in lexicographic order."""
        inner = torch.nonzero(self.slot > 0).squeeze(1)  # [P] sorted positions with a predecessor
        if inner.numel() == 0:
            return True
        split = self.lcp[inner]  # [P]
        before = _token_after(batch.tokens, self.order[inner - 1], split)
        after = _token_after(batch.tokens, self.order[inner], split)
        return bool(((before < after) | (split >= self.reach)).all())

    # ------------------------------------------------------------------ views
    @property
    def groups(self) -> int:
        return int(self.sizes.numel())

    @property
    def max_size(self) -> int:
        """Largest group size K_max."""
        return int(self.sizes.max()) if self.groups else 0

    def classes_at(self, positions: torch.Tensor) -> torch.Tensor:
        """Prefix classes at per-group boundaries (each at most ``reach``).

        :param positions: ``[G, B]`` boundary per group (``-1`` = unused).
        :return: ``[N, B]`` int64 class id per sorted response and boundary slot: two
            sorted responses share a class iff they are in the same group and share their
            first ``p`` tokens. Ids are unique across the whole tensor (slot-major).
        """
        n = int(self.order.numel())
        boundary = positions[self.group]  # [N, B]
        opens = (self.lcp.unsqueeze(1) < boundary) | (self.slot == 0).unsqueeze(1)  # [N, B]
        classes = torch.cumsum(opens.to(torch.int64), dim=0) - 1  # [N, B]
        offsets = torch.arange(positions.shape[1], device=positions.device) * max(n, 1)  # [B]
        return classes + offsets

    @cached_property
    def gap_matrix(self) -> torch.Tensor:
        """``[G, K-1]`` adjacent LCPs per group in sorted order (gap ``j`` lies between
        slots ``j`` and ``j + 1``); ``-1`` beyond a group's last gap."""
        kmax = self.max_size
        gaps = torch.full((self.groups, max(kmax - 1, 0)), -1, dtype=torch.int64, device=self.lcp.device)
        inner = self.slot > 0  # [N]
        gaps[self.group[inner], self.slot[inner] - 1] = self.lcp[inner]
        return gaps

    def per_group(self, values: torch.Tensor, fill: float | int) -> torch.Tensor:
        """Scatter sorted per-response ``values [N]`` into a ``[G, K]`` slot layout."""
        out = torch.full((self.groups, self.max_size), fill, dtype=values.dtype, device=values.device)
        out[self.group, self.slot] = values
        return out


def range_minima(gaps: torch.Tensor) -> torch.Tensor:
    """``[G, K-1, K-1]``: entry ``[g, a, k]`` is the minimum of ``gaps[g, a..k]`` for
    ``a <= k`` (the LCP of sorted slots ``a`` and ``k + 1``) and ``-1`` for ``a > k``."""
    count = gaps.shape[1]
    upper = torch.ones(count, count, dtype=torch.bool, device=gaps.device).triu()  # [a, k]: a <= k
    big = torch.iinfo(torch.int64).max
    spread = torch.where(upper, gaps.unsqueeze(1), big)  # [G, K-1(a), K-1(k)]
    return torch.where(upper, torch.cummin(spread, dim=2).values, -1)


@lru_cache(maxsize=16)
def _hash_weights(width: int, bits: int, device: str) -> torch.Tensor:
    """``[width]`` float64 random integer weights in ``[1, 2**bits)``, fixed by a seed."""
    generator = torch.Generator().manual_seed(0x1EAF)
    weights = torch.randint(1, 2**bits, (width,), generator=generator, dtype=torch.int64)
    return weights.to(torch.float64).to(device)


def _prefix_hashes(tokens: torch.Tensor, largest: int) -> torch.Tensor:
    """``[N, R]`` float64: column ``j`` hashes the first ``j + 1`` tokens of each row
    (the empty prefix hashes to 0; see ``_hash_at``). ``largest`` bounds the token ids.

    Every term and partial sum is an integer below 2**53, so the arithmetic is exact and
    equal prefixes always hash equal, whatever the order of summation. Unequal prefixes
    rarely do, and the callers check the tokens exactly. Padding (``-1``) adds nothing.
    """
    n, width = tokens.shape
    if n == 0 or width == 0:
        return torch.zeros((n, width), dtype=torch.float64, device=tokens.device)
    token_bits = (largest + 2).bit_length()
    bits = min(52 - token_bits - (width + 1).bit_length(), 40)
    if bits < 1:
        raise OverflowError("token ids too large to hash exactly")  # callers sort exactly instead
    weights = _hash_weights(width, bits, str(tokens.device))  # [R]
    hashes = tokens.to(torch.float64)
    torch.addcmul(weights, hashes, weights, out=hashes)  # (token + 1) * weight
    return hashes.cumsum_(dim=1)


def _hash_at(hashes: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Hash of the first ``lengths`` tokens of ``rows`` (broadcast shapes)."""
    if hashes.shape[1] == 0:
        return torch.zeros(torch.broadcast_shapes(rows.shape, lengths.shape), dtype=torch.float64,
                           device=hashes.device)
    values = hashes[rows, (lengths - 1).clamp(min=0)]
    return torch.where(lengths > 0, values, 0.0)


def _hash_lcp(hashes: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Longest prefix length on which the hashes of rows ``left`` and ``right`` agree
    (broadcast shapes), by binary search over the prefix length."""
    width = hashes.shape[1]
    left, right = torch.broadcast_tensors(left * width - 1, right * width - 1)  # flat offset of "length 0"
    low = torch.zeros_like(left)
    if width == 0:
        return low
    high = torch.full_like(left, width)
    for _ in range(max(width, 1).bit_length()):
        # a pair that already failed at length 1 is never retested below it, so testing
        # length 1 again once converged on 0 changes nothing (and keeps indices >= 0)
        middle = ((low + high + 1) // 2).clamp_(min=1)
        agree = hashes.take(left + middle) == hashes.take(right + middle)
        low = torch.where(agree, middle, low)
        high = torch.where(agree, high, middle - 1)
    return low


def _token_after(tokens: torch.Tensor, rows: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """The token at position ``prefix`` of ``rows``; ``-2`` past the padded width, so
    that identical rows compare equal there."""
    width = tokens.shape[1]
    values = tokens[rows, prefix.clamp(max=max(width - 1, 0))] if width else torch.zeros_like(prefix)
    return torch.where(prefix < width, values, -2)


def _first_difference(upper: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """``[M]`` first column where two ``[M, R]`` rows differ, ``R`` if they are equal."""
    width = upper.shape[1]
    if width == 0:
        return torch.zeros(upper.shape[0], dtype=torch.int64, device=upper.device)
    differs = upper != lower  # [M, R]
    first = differs.view(torch.uint8).argmax(dim=1)  # [M]
    found = differs.gather(1, first.unsqueeze(1)).squeeze(1)
    return torch.where(found, first, width)


def _members(index: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``[G, K]`` batch indices of each group's responses (batch order), ``-1`` padded."""
    order = torch.argsort(index, stable=True)  # [N]
    start = torch.cumsum(sizes, 0) - sizes
    slot = torch.arange(index.numel(), device=index.device) - start[index[order]]
    members = torch.full((sizes.numel(), int(sizes.max()) if sizes.numel() else 0), -1, dtype=torch.int64,
                         device=index.device)
    members[index[order], slot] = order
    return members


def _lexicographic_order(keys: torch.Tensor) -> torch.Tensor:
    """``[N]`` stable order of the rows of ``[N, C]`` integer keys, lexicographically
    ascending: one stable sort per column, last column first (C is 1 + the fork budget;
    ``torch.unique(dim=0)`` would compare rows one pair at a time)."""
    order = torch.arange(keys.shape[0], device=keys.device)
    for column in range(keys.shape[1] - 1, -1, -1):
        order = order[torch.argsort(keys[order, column], stable=True)]
    return order
