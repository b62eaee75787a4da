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
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.machinery.group_stats import group_total, per_response
from leaf_plugins.estimators.machinery.painting import paint_segments
from leaf_plugins.estimators.parameters import SpanCreditParams


__all__ = ["span_advantages", "STD_FLOOR"]

STD_FLOOR = 1e-6


def span_advantages(batch: RolloutBatch, nodes: Nodes, params: SpanCreditParams) -> torch.Tensor:
    """Per-token advantages ``[N, T]`` float32 (0 on padding) from the nodes' paths."""
    values, sizes = _segment_table(batch, nodes, params)  # [N, D+2] each
    # the [N, T] painting runs outside inference mode: its output is an ordinary tensor
    # that a loss may multiply with differentiable log-probabilities
    return paint_segments(values, sizes, batch.width)


@torch.inference_mode()
def _segment_table(batch: RolloutBatch, nodes: Nodes, params: SpanCreditParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised segment values (float32) and sizes ``[N, D+2]`` whose sizes add up to
    ``T`` per row: the segments of the response, then the padding ``[H_i, T)`` as a zero
    segment."""
    values, bounds = _segments(batch, nodes, params.terms)  # [N, D+1], [N, D+2]
    entries = torch.diff(bounds, dim=1) > 0  # [N, D+1]: spans of the path, before their ends are cut at H_i
    bounds = bounds.clamp(max=batch.lengths.unsqueeze(1))
    sizes = torch.diff(bounds, dim=1, append=torch.full_like(bounds[:, :1], batch.width))  # [N, D+2]
    values = _normalise(values, sizes[:, :-1], entries, batch, params.normalize)
    return torch.cat([values, torch.zeros_like(values[:, :1])], dim=1).float(), sizes


def _segments(batch: RolloutBatch, nodes: Nodes, terms: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw value ``[N, D+1]`` float64 of each segment and their bounds ``[N, D+2]``:
    segment ``j`` covers ``[bounds[j], bounds[j+1])``, cut at ``H_i`` (a node can lie past
    the end of a short response under ``horizon: each``; the bounds are returned uncut).

    Past its last node ``v_q`` a path goes on through *leaves*: at ``H_i``, with value
    ``r_i`` and one member. The span ending at the first leaf is then the tail, with the
    tail's value, and the spans between leaves are empty.
    """
    path = nodes.path if nodes.count else nodes.path[:, :0]  # [N, D]; no node: nothing to look up
    on_path = path >= 0
    node = path.clamp(min=0)  # [N, D]
    lengths = batch.lengths.unsqueeze(1)  # [N, 1]
    rewards = batch.rewards.double().unsqueeze(1)  # [N, 1]
    root = per_response(nodes.root_value.double(), batch.groups).unsqueeze(1)  # [N, 1]
    value = torch.where(on_path, nodes.value.double().take(node), rewards)  # [N, D]: a leaf's value is r_i
    chain = torch.cat([root, value, rewards], dim=1)  # [N, D+2]: V(v_0), V(v_1), …, then leaves
    child, parent = chain[:, 1:], chain[:, :-1]  # V(v_j), V(v_{j-1}) for j = 1 … D+1
    if terms == "global":
        credit = child - root
    elif terms == "local":
        credit = child - parent
    else:
        credit = 2 * child - root - parent
    members = torch.nn.functional.pad(torch.where(on_path, nodes.size.take(node), 1), (0, 1), value=1)  # [N, D+1]
    position = torch.where(on_path, nodes.position.take(node), lengths)  # [N, D]: a leaf sits at H_i
    bounds = torch.cat([torch.zeros_like(lengths), position, lengths], dim=1)  # [N, D+2]
    return credit * members.double().rsqrt_(), bounds


def _normalise(
    values: torch.Tensor, sizes: torch.Tensor, entries: torch.Tensor, batch: RolloutBatch, how: str
) -> torch.Tensor:
    """Normalise segment values ``[N, S]`` (``sizes``: tokens per segment; ``entries``:
    which segments are spans of the response's path).

    ``span``: z-score per group over the spans of its responses' paths, one entry each:
    every ``[p(v_{j-1}), p(v_j))`` with ``p(v_j) > p(v_{j-1})``, even one that lies wholly
    past a short response's end (it holds none of its tokens), and the tail when
    ``p(v_q) < H_i`` (spec, LEAF step 4: the authors' code does the same); ``token``:
    z-score per group over its tokens; ``batch``: z-score over all tokens of the batch.
    Standard deviations are sample (n - 1) ones, floored at 1e-6.
    """
    if how == "none":
        return values
    weights = entries.double() if how == "span" else sizes.double()  # [N, S]
    layout = GroupLayout.whole(batch.size, batch.device) if how == "batch" else batch.groups
    count = group_total(weights, layout)  # [G]
    centred = values - per_response(group_total(values * weights, layout) / count.clamp(min=1), layout).unsqueeze(1)
    square = group_total(centred * centred * weights, layout)  # [G]
    std = (square / (count - 1).clamp(min=1)).sqrt_()  # a lone segment is its mean: square is 0
    return centred / per_response(std.clamp_(min=STD_FLOOR), layout).unsqueeze(1)  # [N, S]
