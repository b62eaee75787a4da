"""Prefix hashes, and the exact lexicographic order of every group (the full tree).

The responses of a batch are put in (group, lexicographic) order, in which every prefix
class at every depth is contiguous within its group. Then two neighbours' longest common
prefix (LCP), found by one exact token comparison, decides everything: responses share
their first ``p`` tokens iff every adjacent LCP between them is at least ``p``.

Finding that order by comparing whole rows is slow when responses share long prefixes,
so it is proposed from hashes of blocks of ``BLOCK`` tokens (two responses compared block
hash by block hash, then token by token inside the first block that differs) and then
*checked exactly* on the tokens; in the (never observed) event of a hash collision the
exact check fails and the order is recomputed by a plain lexicographic sort of the
rows, which is also what ``prefix_classes`` falls back on (it compares running prefix
hashes, ``running_hashes``). Results are exact either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.scratch import scratch

__all__ = ["SortedPrefixes", "range_minima", "running_hashes", "compact_hashes", "compact_tokens", "block_hashes",
           "first_difference", "BLOCK"]

BLOCK = 32
"""Columns per block of ``block_hashes``: the order compares two responses block hash by
block hash, then token by token inside the first block that differs."""


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
    def of(cls, batch: RolloutBatch) -> "SortedPrefixes":
        """``lexicographic(batch)``, built once per estimator call (``RolloutBatch.call_cached``):
        the stages of a call that all need it share one."""
        return batch.call_cached("SortedPrefixes.lexicographic", lambda: cls.lexicographic(batch))

    @classmethod
    @torch.inference_mode()
    def lexicographic(cls, batch: RolloutBatch) -> "SortedPrefixes":
        """Responses in (group, lexicographic) order: every prefix class at every depth is
        contiguous (padding ``-1`` sorts before every token)."""
        layout = batch.groups
        width = batch.width
        rows = compact_tokens(batch.tokens, batch.token_bound)  # [N, W]: W a multiple of BLOCK
        members = layout.members  # [G, K] batch index, -1 padded
        slots = members.shape[1]
        valid = members >= 0
        members_at = members.clamp(min=0)
        first, second = torch.triu_indices(slots, slots, 1, device=batch.device)  # [P] slot pairs, first < second
        left, right = members_at[:, first], members_at[:, second]  # [G, P]
        shared = _block_lcp(rows, block_hashes(rows), left, right).clamp_(max=width)  # [G, P]
        # the second slot sorts first iff its next token is smaller (identical rows keep slot order)
        after = _token_after(batch.tokens, torch.stack([right, left]), shared)  # [2, G, P]
        swapped = after[0] < after[1]  # [G, P]
        rank = torch.zeros_like(members)  # [G, K]: how many real slots sort before each slot
        rank.index_add_(1, first, (swapped & valid[:, second]).long())
        rank.index_add_(1, second, (~swapped & valid[:, first]).long())
        rank.masked_fill_(~valid, slots)
        positions = torch.arange(slots, device=batch.device)
        order = members.gather(1, rank.argsort(dim=1))[valid.sum(dim=1, keepdim=True) > positions]  # [N]
        prefixes = cls._from_order(batch, order, rows)
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
        return cls._from_order(batch, torch.argsort(rank, stable=True))

    @classmethod
    def _from_order(cls, batch: RolloutBatch, order: torch.Tensor, hashes: torch.Tensor | None = None) -> "SortedPrefixes":
        """The responses in ``order [N]`` with their exact adjacent LCPs, found by comparing
        the tokens or, where given, ``hashes`` ``[N, W]`` that agree on their first ``p``
        columns exactly when the tokens do (``compact_tokens``, or ``running_hashes``;
        int32 where token ids allow, half the bytes of the tokens)."""
        layout = batch.groups
        n, reach = batch.size, batch.width
        group = layout.index[order]  # [N]
        lcp = torch.full((n,), -1, dtype=torch.int64, device=batch.device)
        if n > 1:
            rows = batch.tokens if hashes is None else hashes  # [N, W]
            ordered = torch.index_select(rows, 0, order, out=scratch("sorted rows", tuple(rows.shape), rows.dtype,
                                                                      rows.device))  # [N, W]
            column = first_difference(ordered[:-1], ordered[1:])  # [N-1] first column that differs
            lcp[1:] = torch.where(group[1:] == group[:-1], column.clamp_(max=reach), -1)  # columns past R are padding
        start = torch.cumsum(layout.sizes, 0) - layout.sizes  # [G]
        slot = torch.arange(n, device=batch.device) - start[group]  # [N]
        return cls(order, group, lcp, slot, layout.sizes, reach)

    def _is_lexicographic(self, batch: RolloutBatch) -> bool:
        """Exact check that each adjacent pair of a group is in lexicographic order."""
        inner = torch.nonzero(self.slot > 0).squeeze(1)  # [P] sorted positions with a predecessor
        if inner.numel() == 0:
            return True
        split = self.lcp[inner]  # [P]
        before, after = _token_after(batch.tokens, torch.stack([self.order[inner - 1], self.order[inner]]), split)
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
def _odd_multipliers(width: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """``[width]`` random odd multipliers (int64, or their low 32 bits), fixed by a seed."""
    generator = torch.Generator().manual_seed(0x1EAF)
    odd = torch.randint(-(2**63), 2**63 - 1, (width,), generator=generator, dtype=torch.int64) | 1
    return odd.to(dtype).to(device)


def running_hashes(
    tokens: torch.Tensor, dtype: torch.dtype = torch.int64, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``[N, R]`` running hashes: column ``j`` is ``sum_{t <= j} token_t * m_t`` with random
    odd multipliers ``m``, modulo ``2**64`` (int64) or ``2**32`` (int32; token ids must
    then be below ``2**31``). Padding (``-1``) counts as a token value of its own.

    Modular arithmetic is exact in any order, so equal prefixes always hash equal. Odd
    multipliers are invertible, so two rows' hashes agree on columns ``0 … p-1`` *iff*
    their first ``p`` tokens do: comparing hash rows is an exact token comparison (int32
    rows: at half the memory of the int64 tokens). A single column can collide (unequal
    prefixes, equal hash: for a fixed pair, about ``2**-32`` in int32).

    :param out: an optional contiguous ``[N, R']`` tensor of ``dtype``, ``R' >= R``, to
        write the hashes into; its columns past ``R`` hash a token 0 (they repeat the
        row's last hash).
    """
    reach = tokens.shape[1]
    if out is None:
        out = torch.empty(tokens.shape, dtype=dtype, device=tokens.device)
    multipliers = _odd_multipliers(out.shape[1], torch.int64, str(tokens.device))  # [R']
    # the sums run in int64 whatever the dtype (an int64 running sum is 2-3× faster than an
    # int32 one on the CPU); int32 hashes are their low 32 bits, the sums modulo 2**32 with
    # the multipliers' low 32 bits, which are odd too
    wide = out if dtype == torch.int64 else scratch("running hashes", tuple(out.shape), torch.int64, out.device)
    torch.mul(tokens, multipliers[:reach], out=wide[:, :reach])
    wide[:, reach:].zero_()
    wide.cumsum_(dim=1)
    return out if wide is out else out.copy_(wide)


def _compact_dtype(token_bound: int) -> torch.dtype:
    """int32 where every token id (below ``token_bound``) and the padding fit, else int64."""
    return torch.int32 if token_bound < 2**31 else torch.int64


def compact_hashes(tokens: torch.Tensor, token_bound: int) -> torch.Tensor:
    """``running_hashes`` of ``tokens [N, R]`` in the scratch buffer ``"hashes"``: int32
    where token ids are below ``2**31`` (half the bytes to compare), int64 otherwise."""
    narrow = _compact_dtype(token_bound)
    return running_hashes(tokens, narrow, out=scratch("hashes", tuple(tokens.shape), narrow, tokens.device))


def compact_tokens(tokens: torch.Tensor, token_bound: int) -> torch.Tensor:
    """``[N, W]`` the ``tokens [N, R]`` in the scratch buffer ``"compact tokens"``, ``W``
    the next multiple of ``BLOCK`` (columns past ``R`` hold the padding, ``-1``): int32
    where token ids are below ``2**31`` (half the bytes to compare), int64 otherwise."""
    count, reach = tokens.shape
    compact = scratch("compact tokens", (count, -(-reach // BLOCK) * BLOCK), _compact_dtype(token_bound),
                      tokens.device)
    compact[:, :reach].copy_(tokens)
    compact[:, reach:].fill_(-1)
    return compact


def block_hashes(rows: torch.Tensor) -> torch.Tensor:
    """``[N, W / BLOCK]`` one hash per block of ``BLOCK`` columns of ``rows [N, W]``
    (``compact_tokens``): the sum of token times a random odd multiplier per column,
    wrapping in the rows' dtype. Equal blocks hash equal; unequal ones collide with
    probability about ``2**-32`` (int32)."""
    count, width = rows.shape
    multipliers = _odd_multipliers(width, rows.dtype, str(rows.device))  # [W]
    products = torch.mul(rows, multipliers, out=scratch("block hashes", (count, width), rows.dtype, rows.device))
    return products.view(count, width // BLOCK, BLOCK).sum(dim=2, dtype=rows.dtype)


def _block_lcp(rows: torch.Tensor, hashes: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Longest common prefix of rows ``left`` and ``right`` of ``rows [N, W]`` (``[G, P]``
    index pairs), ``W`` where they are equal: the first block whose ``hashes [N, W / BLOCK]``
    (``block_hashes``) differ, then the first column that differs inside it. Exact
    unless two unequal blocks before it hash alike (the order's exact check catches that)."""
    width = rows.shape[1]
    if width == 0:
        return torch.zeros_like(left)
    count = hashes.shape[1]
    shape = tuple(left.shape)

    def differing_column(values: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """``[G, P]`` the first column where rows ``first`` and ``second`` of ``values [M, C]``
        differ, ``C`` where they do not (``first_difference`` on whole-row selections)."""
        both = torch.index_select(values, 0, torch.cat([first.reshape(-1), second.reshape(-1)]))
        both = both.view(2, first.numel(), values.shape[1])
        return first_difference(both[0], both[1]).view(shape)

    block = differing_column(hashes, left, right)  # [G, P]: the first block that differs, `count` if none
    inside = block.clamp(max=count - 1)
    offset = differing_column(rows.view(-1, BLOCK), left * count + inside, right * count + inside)  # BLOCK if equal
    return torch.where((block < count) & (offset < BLOCK), block * BLOCK + offset, width)


def _token_after(tokens: torch.Tensor, rows: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """The token at position ``prefix`` of ``rows`` (the two broadcast together); ``-2``
    past the padded width, so that identical rows compare equal there."""
    width = tokens.shape[1]
    if width == 0:
        shape = torch.broadcast_shapes(rows.shape, prefix.shape)
        return torch.full(shape, -2, dtype=tokens.dtype, device=tokens.device)
    values = tokens.view(-1).take(rows * width + prefix.clamp(max=width - 1))  # rows and prefix broadcast
    return torch.where(prefix < width, values, -2)


def first_difference(upper: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """``[M]`` first column where two ``[M, R]`` int32 or int64 rows differ, ``R`` if
    they are equal.

    The rows are compared as int32 words (an int64 column is two), 1/0 into the scratch
    buffer ``"first difference"``, and each word's 1 is weighted by ``R − column``: the
    largest weight is at the first column that differs. Same-dtype int32 compares,
    products and maxima are vectorised; a compare into a bool mask is not (3.5× slower on
    CPU), and nor is the index of a maximum (``max(dim=1)``, 4× slower)."""
    if upper.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"first_difference compares int32 or int64 rows, got {upper.dtype}")
    width = upper.shape[1]
    if width == 0:
        return torch.zeros(upper.shape[0], dtype=torch.int64, device=upper.device)
    if upper.dtype == torch.int64:
        upper, lower = (rows.contiguous().view(torch.int32) for rows in (upper, lower))  # [M, R·w]
    unequal = scratch("first difference", tuple(upper.shape), torch.int32, upper.device)  # [M, R·w]
    countdown = _countdown(width, upper.shape[1] // width, str(upper.device))  # [R·w]
    latest = torch.ne(upper, lower, out=unequal).mul_(countdown).amax(dim=1)  # [M] R − first, 0 if none
    return width - latest.long()


@lru_cache(maxsize=64)
def _countdown(width: int, words: int, device: str) -> torch.Tensor:
    """``[width · words]`` int32 ``width − column`` of each int32 word of a row of
    ``width`` columns, ``words`` words each."""
    return torch.arange(width, 0, -1, dtype=torch.int32, device=device).repeat_interleave(words)
