"""Span credit shared by the tree estimators (spec, LEAF steps 3 and 4).

Response ``i`` with path ``v_1 … v_q`` (root ``v_0`` at position 0) gets
``(GA + LA) / sqrt(n(v_j))`` on tokens ``[p(v_{j-1}), p(v_j))`` and
``(r_i - V0) + (r_i - V(v_q))`` on its tail ``[p(v_q), H_i)``. Raw advantages are
piecewise constant, so they are computed and normalised per *segment* (``[N, D+1]``)
and written to the ``[N, T]`` token layout once, at the end.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import GroupLayout, RolloutBatch
from leaf_plugins.core.params import EstimatorParams
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.group_stats import group_sum, per_response
from leaf_plugins.estimators.painting import paint_segments

__all__ = ["span_advantages", "STD_FLOOR"]

STD_FLOOR = 1e-6


def span_advantages(batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
    """Per-token advantages ``[N, T]`` float32 (0 on padding) from the nodes' paths."""
    values, sizes = _segment_table(batch, nodes, params)  # [N, D+2] each
    # the [N, T] painting runs outside inference mode: its output is an ordinary tensor
    # that a loss may multiply with differentiable log-probabilities
    return paint_segments(values, sizes, batch.width)


@torch.inference_mode()
def _segment_table(batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised segment values (float32) and sizes ``[N, D+2]`` whose sizes add up to
    ``T`` per row: the segments of the response, then the padding ``[H_i, T)`` as a zero
    segment."""
    values, starts = _segments(batch, nodes, params.terms)  # [N, D+1] each
    lengths = batch.lengths.unsqueeze(1)  # [N, 1]
    sizes = torch.diff(torch.cat([starts, lengths, torch.full_like(lengths, batch.width)], dim=1), dim=1)  # [N, D+2]
    values = _normalise(values, sizes[:, :-1], batch, params.normalize)
    return torch.cat([values, torch.zeros_like(values[:, :1])], dim=1).float(), sizes


def _segments(batch: RolloutBatch, nodes: Nodes, terms: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw value ``[N, D+1]`` float64 and start position ``[N, D+1]`` of each segment.

    Segment ``j < q`` is the span ending at the ``(j+1)``-th node of the path, segment
    ``q`` the tail; later segments are empty (they start at ``H_i``).
    """
    lengths = batch.lengths.unsqueeze(1)  # [N, 1]
    rewards = batch.rewards.double().unsqueeze(1)  # [N, 1]
    root = per_response(nodes.root_value.double(), batch.groups).unsqueeze(1)  # [N, 1]
    depth = (nodes.path >= 0).sum(dim=1, keepdim=True)  # [N, 1]: q
    deepest = int(depth.max()) if batch.size else 0  # paths end in -1: later columns are empty
    node = nodes.path[:, :deepest].clamp(min=0)  # [N, D']
    chain = torch.cat([root, nodes.value.double().take(node)], dim=1)  # [N, D'+1]: V(v_0), V(v_1), …
    value, parent, last = chain[:, 1:], chain[:, :-1], chain.gather(1, depth)  # last: V(v_q)
    if terms == "global":
        span, tail = value - root, rewards - root
    elif terms == "local":
        span, tail = value - parent, rewards - last
    else:
        span, tail = 2 * value - root - parent, 2 * rewards - root - last
    segment = torch.arange(deepest + 1, device=batch.device)
    values = torch.cat([span * nodes.size.take(node).double().rsqrt_(), tail], dim=1)  # [N, D'+1]
    values = torch.where(segment < depth, values, tail)
    starts = torch.cat([torch.zeros_like(lengths), nodes.position.take(node)], dim=1)  # [N, D'+1]
    return values, torch.where(segment <= depth, starts, lengths).clamp_(max=lengths)


def _normalise(values: torch.Tensor, sizes: torch.Tensor, batch: RolloutBatch, how: str) -> torch.Tensor:
    """Normalise segment values ``[N, S]`` (``sizes``: tokens per segment).

    ``span``: z-score per group over its non-empty segments, one entry each; ``token``:
    z-score per group over its tokens; ``batch``: z-score over all tokens of the batch.
    Standard deviations are sample (n - 1) ones, floored at 1e-6.
    """
    if how == "none":
        return values
    weights = (sizes > 0).double() if how == "span" else sizes.double()  # [N, S]
    layout = GroupLayout.whole(batch.size, batch.device) if how == "batch" else batch.groups
    count, weighted = group_sum(torch.stack([weights.sum(dim=1), (values * weights).sum(dim=1)], dim=1), layout).unbind(1)
    centred = values - per_response(weighted / count.clamp(min=1), layout).unsqueeze(1)  # [N, S]
    square = group_sum((centred * centred * weights).sum(dim=1), layout)  # [G]
    std = (square / (count - 1).clamp(min=1)).sqrt_().masked_fill_(count <= 1, 0.0)
    return centred / per_response(std.clamp_(min=STD_FLOOR), layout).unsqueeze(1)
