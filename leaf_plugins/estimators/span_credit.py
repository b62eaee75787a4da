"""Span credit shared by the tree estimators (spec, LEAF steps 3 and 4).

Response ``i`` with path ``v_1 … v_q`` (root ``v_0`` at position 0) gets
``(GA + LA) / sqrt(n(v_j))`` on tokens ``[p(v_{j-1}), p(v_j))`` and
``(r_i - V0) + (r_i - V(v_q))`` on its tail ``[p(v_q), H_i)``. Raw advantages are
piecewise constant, so they are computed and normalised per *segment* (``[N, D+1]``)
and written to the ``[N, T]`` token layout once, at the end.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.params import EstimatorParams
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.group_stats import group_sum

__all__ = ["span_advantages", "STD_FLOOR"]

STD_FLOOR = 1e-6


def span_advantages(batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
    """Per-token advantages ``[N, T]`` float32 (0 on padding) from the nodes' paths."""
    values, sizes = _segment_table(batch, nodes, params)
    # the one [N, T] operation runs outside inference mode: its output is an ordinary
    # tensor that a loss may multiply with differentiable log-probabilities
    return torch.repeat_interleave(values.reshape(-1), sizes.reshape(-1), output_size=batch.size * batch.width).view(
        batch.size, batch.width
    )


@torch.inference_mode()
def _segment_table(batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised segment values and sizes ``[N, D+2]`` whose sizes add up to ``T`` per row:
    the segments of the response, then the padding ``[H_i, T)`` as a zero segment."""
    values, starts = _segments(batch, nodes, params.terms)  # [N, D+1] each
    lengths = batch.lengths.unsqueeze(1)  # [N, 1]
    starts = torch.minimum(starts, lengths)  # a segment starting past the end is empty
    ends = torch.cat([starts[:, 1:], lengths], dim=1)  # [N, D+1]
    values = _normalise(values, (ends - starts).clamp(min=0), batch, params.normalize)
    bounds = torch.cat([starts, lengths, torch.full_like(lengths, batch.width)], dim=1)  # [N, D+3]
    table = torch.cat([values, torch.zeros_like(values[:, :1])], dim=1).float()  # [N, D+2]
    return table, torch.diff(bounds, dim=1)


def _segments(batch: RolloutBatch, nodes: Nodes, terms: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw value ``[N, D+1]`` float64 and start position ``[N, D+1]`` of each segment.

    Segment ``j < q`` is the span ending at the ``(j+1)``-th node of the path, segment
    ``q`` the tail; later segments do not exist (start ``T``, value 0).
    """
    width = batch.width
    on_path = nodes.path >= 0  # [N, D]
    node = nodes.path.clamp(min=0)  # [N, D]
    rewards = batch.rewards.double()  # [N]
    root = nodes.root_value.double()[batch.groups.index]  # [N]
    if nodes.count:
        value = torch.where(on_path, nodes.value.double()[node], 0.0)  # [N, D]
        size = nodes.size[node].clamp(min=1).double()  # [N, D]
        position = torch.where(on_path, nodes.position[node], width)  # [N, D]
    else:
        value = torch.zeros(on_path.shape, dtype=torch.float64, device=batch.device)
        size = torch.ones_like(value)
        position = torch.full(on_path.shape, width, dtype=torch.int64, device=batch.device)
    chain = torch.cat([root.unsqueeze(1), value], dim=1)  # [N, D+1]: V(v_0), V(v_1), …
    parent = chain[:, :-1]  # [N, D]
    depth = on_path.sum(dim=1)  # [N]: q
    last = chain.gather(1, depth.unsqueeze(1)).squeeze(1)  # [N]: V(v_q), the root when q = 0
    span_global, span_local = value - root.unsqueeze(1), value - parent  # [N, D]
    tail_global, tail_local = rewards - root, rewards - last  # [N]
    if terms == "global":
        span, tail = span_global, tail_global
    elif terms == "local":
        span, tail = span_local, tail_local
    else:
        span, tail = span_global + span_local, tail_global + tail_local
    span = torch.where(on_path, span / size.sqrt(), 0.0)  # [N, D]
    values = torch.cat([span, torch.zeros_like(root).unsqueeze(1)], dim=1)  # [N, D+1]
    values.scatter_(1, depth.unsqueeze(1), tail.unsqueeze(1))
    starts = torch.cat([torch.zeros_like(depth).unsqueeze(1), position], dim=1)  # [N, D+1]
    exists = torch.arange(starts.shape[1], device=batch.device) <= depth.unsqueeze(1)
    return values, torch.where(exists, starts, width)


def _normalise(values: torch.Tensor, sizes: torch.Tensor, batch: RolloutBatch, how: str) -> torch.Tensor:
    """Normalise segment values ``[N, D+1]`` (``sizes``: tokens per segment).

    ``span``: z-score per group over its non-empty segments, one entry each; ``token``:
    z-score per group over its tokens; ``batch``: z-score over all tokens of the batch.
    Standard deviations are sample (n - 1) ones, floored at 1e-6.
    """
    if how == "none":
        return values
    layout = batch.groups
    weights = (sizes > 0).double() if how == "span" else sizes.double()  # [N, D+1]
    if how == "batch":
        index = torch.zeros_like(layout.index)
        groups = 1
    else:
        index, groups = layout.index, layout.count
    counts = group_sum(weights.sum(dim=1), index, groups)  # [G]
    mean = group_sum((values * weights).sum(dim=1), index, groups) / counts.clamp(min=1)  # [G]
    centred = values - mean[index].unsqueeze(1)  # [N, D+1]
    square = group_sum((centred * centred * weights).sum(dim=1), index, groups)
    std = (square / (counts - 1).clamp(min=1)).sqrt() * (counts > 1)
    return centred / std.clamp(min=STD_FLOOR)[index].unsqueeze(1)
