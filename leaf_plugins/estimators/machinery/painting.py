"""Writing piecewise-constant rows: per-token values from per-segment values and sizes.

Every row of the result is a run of segments, ``sizes[i, j]`` tokens of value
``values[i, j]``. Read row-major, the whole ``[N, T]`` result is one flat run of the
``N·S`` segments, which is how both methods below see it.

Small batches look every token's segment up (one gather per token). Large ones paint
*blocks* of ``BLOCK`` tokens: each block is filled with the value at its first token by
one broadcast copy, which is as fast as filling memory, and only the tokens between a
segment's start and the next block boundary, at most ``BLOCK - 1`` per segment, are
then written one by one. Both give the same result bit for bit.
"""

from __future__ import annotations

import torch

__all__ = ["paint_segments", "paint_by_lookup", "paint_by_blocks", "BLOCK", "BLOCKS_FROM"]

BLOCK = 16
"""Tokens per block of the block painting."""

BLOCKS_FROM = 1 << 17
"""Batches of at least this many token positions (``N·T``) are painted by blocks: below
it the per-token lookup is cheaper than the block method's fixed cost."""


def paint_segments(values: torch.Tensor, sizes: torch.Tensor, width: int) -> torch.Tensor:
    """``[N, T]`` rows made of ``sizes [N, S]`` tokens of ``values [N, S]`` each.

    :param values: per-segment values, any dtype; the result has the same.
    :param sizes: int64 segment lengths; every row sums to ``width``.
    """
    if values.shape[0] * width >= BLOCKS_FROM:
        return paint_by_blocks(values, sizes, width)
    return paint_by_lookup(values, sizes, width)


def paint_by_lookup(values: torch.Tensor, sizes: torch.Tensor, width: int) -> torch.Tensor:
    """One gather per token, from int32 segment numbers."""
    rows = values.shape[0]
    segment = torch.repeat_interleave(sizes.view(-1).int(), output_size=rows * width)  # [N*T]
    return values.reshape(-1).index_select(0, segment).view(rows, width)


def paint_by_blocks(values: torch.Tensor, sizes: torch.Tensor, width: int, block: int = BLOCK) -> torch.Tensor:
    """Blocks of ``block`` tokens filled at once, then each segment's first tokens that
    share a block with the segment before it."""
    rows = values.shape[0]
    total = rows * width
    value = values.reshape(-1)  # [NS]
    size = sizes.reshape(-1)  # [NS]
    end = size.cumsum(0)  # [NS] flat end of each segment
    start = end - size
    blocks_before_end = (end + (block - 1)).div_(block, rounding_mode="floor")  # blocks starting before `end`
    blocks_in = torch.diff(blocks_before_end, prepend=blocks_before_end.new_zeros(1))  # [NS] blocks starting inside
    count = -(-total // block)
    first = value.index_select(0, torch.repeat_interleave(blocks_in, output_size=count))  # [count] value at each block start
    # one spare block past the end: writes that must not land anywhere go to index `total`
    out = torch.empty((count + 1) * block, dtype=values.dtype, device=values.device)
    out[: count * block].view(count, block).copy_(first.unsqueeze(1).expand(count, block))
    # a segment's tokens before the first block boundary inside it belong to a block
    # that started in an earlier segment: [start, min(boundary, end))
    stop = torch.minimum((blocks_before_end - blocks_in) * block, end)  # [NS]
    some = stop > start
    lowest = torch.where(some, start, total)
    highest = torch.where(some, stop - 1, total)
    # positions past a segment's last such token repeat that token (same value)
    offsets = torch.arange(block, device=values.device)
    position = torch.minimum(lowest.unsqueeze(1) + offsets, highest.unsqueeze(1))  # [NS, block]
    out.put_(position, value.unsqueeze(1).expand(-1, block).contiguous())
    return out[:total].view(rows, width)

