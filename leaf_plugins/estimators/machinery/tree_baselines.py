"""Leave-one-out prefix baselines along each response's path of retained nodes.

A node ``v`` at position ``p(v)`` holds the responses that share their first ``p(v)``
tokens, so for every token ``t >= p(v)`` of a member ``i`` the *other* members were
chosen by ``i``'s state ``y_<t`` alone: the mean of their rewards is a baseline that
does not depend on ``i``'s own tokens from ``t`` on, nor on its reward, which keeps the
policy gradient unbiased. Token ``t`` of response ``i`` takes the deepest node of its
path with ``p(v) <= t`` (the root, the whole group, before the first one).

A node with few other members gives a noisy mean, so each value is shrunk toward its
parent's: ``V̂(v_j) = (Σ_{others} r + s · V̂(v_{j-1})) / (n(v_j) - 1 + s)``, starting from
the root's leave-one-out mean ``V̂(v_0)``. ``s = 0`` is the plain leave-one-out mean.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch, group_sum
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.machinery.group_stats import per_response
from leaf_plugins.estimators.machinery.painting import paint_segments

__all__ = ["PathBaselines", "path_baselines"]


class PathBaselines:
    """Per response, the shrunk leave-one-out value of each segment of its path.

    Segment ``j`` covers tokens ``[bounds[:, j], bounds[:, j+1])``; segment 0 belongs to
    the root, segment ``j >= 1`` to the path's ``j``-th node. Segments past the end of a
    path are empty.
    """

    def __init__(self, values: torch.Tensor, bounds: torch.Tensor) -> None:
        self.values = values  # [N, D+1] float64
        self.bounds = bounds  # [N, D+2] int64, non-decreasing, last column H_i

    def paint(self, segment_values: torch.Tensor, width: int) -> torch.Tensor:
        """``[N, T]`` rows made of ``segment_values [N, D+1]`` over the segments, 0 on
        padding (same dtype as the values)."""
        sizes = torch.diff(self.bounds, dim=1, append=torch.full_like(self.bounds[:, :1], width))  # [N, D+2]
        padded = torch.cat([segment_values, torch.zeros_like(segment_values[:, :1])], dim=1)
        return paint_segments(padded, sizes, width)


@torch.inference_mode()
def path_baselines(batch: RolloutBatch, nodes: Nodes, shrink: float | torch.Tensor) -> PathBaselines:
    """The shrunk leave-one-out values of every response's path (see the module).

    ``shrink``: one weight, or ``[N]`` float64 weights, one per response. A response
    alone in its group has no other response to learn from: its root value is its own
    reward, so its advantage against it is 0.
    """
    layout = batch.groups
    rewards = batch.rewards.double()  # [N]
    others = per_response(layout.sizes, layout) - 1  # [N]
    total = per_response(group_sum(rewards, layout), layout)  # [N]
    path = nodes.path if nodes.count else nodes.path[:, :0]  # [N, D]
    on_path = path >= 0
    node = path.clamp(min=0)
    # V̂_j = a_j + b_j · V̂_{j-1}: a_j = (Σ_others r) / (n - 1 + s), b_j = s / (n - 1 + s) on
    # the path, a_j = 0 and b_j = 1 past its end; one multiply-add per depth
    prior = shrink.unsqueeze(1) if isinstance(shrink, torch.Tensor) else shrink  # s: [N, 1] or a number
    size = nodes.size.double().take(node)  # [N, D]
    others_sum = nodes.value.double().take(node).mul_(size).sub_(rewards.unsqueeze(1))  # [N, D]
    denominator = (size - 1 + prior).clamp_(min=1e-300)  # [N, D]
    offset = others_sum.div_(denominator).mul_(on_path)  # [N, D] a
    slope = torch.where(on_path, prior / denominator, 1.0)  # [N, D] b
    values = torch.empty((batch.size, path.shape[1] + 1), dtype=torch.float64, device=batch.device)  # [N, D+1]
    torch.where(others > 0, (total - rewards) / others.clamp(min=1), rewards, out=values[:, 0])  # V̂(v_0)
    for depth in range(path.shape[1]):  # along the path: at most B (or the trie's depth) steps
        torch.addcmul(offset[:, depth], slope[:, depth], values[:, depth], out=values[:, depth + 1])
    lengths = batch.lengths.unsqueeze(1)  # [N, 1]
    position = torch.where(on_path, nodes.position.take(node), lengths)  # [N, D]: off the path, empty segments
    bounds = torch.cat([torch.zeros_like(lengths), position, lengths], dim=1).clamp_(max=lengths)  # [N, D+2]
    return PathBaselines(values, bounds)
