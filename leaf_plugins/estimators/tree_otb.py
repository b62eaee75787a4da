"""Tree OTB: a variance-aware prefix baseline (see docs/estimators.md, ``tree_otb``).

The baseline that minimises the policy gradient's variance at a state ``s`` is
``b*(s) = E[w Q(s, a)] / E[w]`` with ``w = 1 − 2π(a|s) + Σπ²``: where rare tokens cost
reward (a wrong word), it sits below the state's value ``V(s)``. Tree OTB estimates it
as ``b = f + κ · (V̂(s) − f)``:

* ``V̂(s)``: the shrunk leave-one-out value of the deepest retained node on the
  response's path at or before the token (``tree_baselines``), the others that share its
  prefix;
* ``κ``: how far below the value the score-weighted return lies, for states of the
  token's kind, learnt from the *other groups* of the batch:
  ``κ = Σ w (r − f) / Σ w (r̄_group − f)`` over their tokens whose state has a similar
  ``1 − Σπ²`` (bins ``KAPPA_EDGES``); 1 when the batch has no other group;
* ``f``: the lowest reward of the other groups (the origin of the ratio, so that shifting
  all rewards shifts the baseline with them).

None of these depends on the response's own tokens from the token on or on its reward:
the baseline is unbiased. With ``own_share`` (the default), the advantage is then
multiplied by ``1 − W_i,t / Σ_j W_j,t`` (``W`` the cumulative weights of the group's
responses still running), which is verl's OTB including the response's own return in
its baseline: a bias that shrinks the advantages of high-variance paths.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.params import EstimatorParams
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.group_stats import group_extreme, group_mean, group_sum, per_response
from leaf_plugins.estimators.node_shrinkage import node_shrink
from leaf_plugins.estimators.tree_baselines import path_baselines
from leaf_plugins.estimators.tree_rloo import TreeRLOO, group_scale
from leaf_plugins.estimators.otb import real_tokens, token_weights

__all__ = ["TreeOTB", "KAPPA_EDGES", "value_ratios", "state_kinds"]

KAPPA_EDGES = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)
"""Bin edges on a state's ``1 − Σπ²``: near-deterministic states first, decisions last."""


class TreeOTB(TreeRLOO):
    """Tree OTB: prefix leave-one-out values scaled to the variance-optimal baseline."""

    parameters = TreeRLOO.parameters | {"own_share"}
    defaults = {"scale": "none"}

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
        baselines = path_baselines(batch, nodes, node_shrink(batch, nodes, params))  # segment values V̂ [N, D+1]
        with torch.inference_mode():
            layout = batch.groups
            real = real_tokens(batch)  # [N, T] float32 1.0 / 0.0
            weights = token_weights(batch, real, dtype=torch.float64)  # [N, T] w, 0 on padding (scratch)
            lowest = _other_groups_floor(batch)  # [G] f
            kind, ratios = value_ratios(batch, weights, lowest)  # [N, T] int64 kind, [N, kinds] κ
            floor = per_response(lowest, layout)  # [N]
            scale = per_response(group_scale(batch, params), layout)  # [N]
            # A = (1 − share) · ((r − f) − κ (V̂ − f)) / c: the per-response and per-segment
            # parts first, then three [N, T] passes
            above = ((batch.rewards.double() - floor) / scale).float().unsqueeze(1)  # [N, 1]
            spread = ((baselines.values - floor.unsqueeze(1)) / scale.unsqueeze(1)).float()  # [N, D+1]
            advantage = baselines.paint(spread, batch.width)  # [N, T] float32 (V̂ − f) / c
            advantage.mul_(ratios.gather(1, kind)).neg_().add_(above)
            if params.own_share:
                advantage.mul_(_others_share(batch, weights, real))
            elif layout.count:  # a response alone has no other to learn from: 0, as with its own share
                advantage.mul_((per_response(layout.sizes, layout) > 1).unsqueeze(1))
            result = advantage.mul_(real)
        return result.clone()


def value_ratios(batch: RolloutBatch, weights: torch.Tensor, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """κ of every (group, kind of state) from the other groups (see the module), measured
    from each group's ``floor [G]``: the ``[N, T]`` int64 kind of every token's state and
    the ``[N, kinds]`` float32 ratios of each response's group, so that a token's κ is
    ``ratios.gather(1, kind)``.

    Rewards are constant along a response, so each response's weight per kind,
    ``Σ_t w [kind]`` ``[N, kinds]``, is all the ``[N, T]`` data needed.
    """
    layout = batch.groups
    kind = state_kinds(batch)  # [N, T]
    kinds = len(KAPPA_EDGES) + 1
    per_response_weight = torch.zeros(batch.size, kinds, dtype=torch.float64, device=batch.device)
    per_response_weight.scatter_add_(1, kind, weights)  # [N, kinds] Σ_t w per kind
    rewards = batch.rewards.double().unsqueeze(1)  # [N, 1]
    mean = per_response(group_mean(batch.rewards.double(), layout), layout).unsqueeze(1)
    sums = torch.stack([group_sum(per_response_weight * term, layout) for term in (rewards, mean, 1.0)])  # [3, G, k]
    others = sums.sum(dim=1, keepdim=True) - sums  # every group but this one
    lowest = floor.unsqueeze(1)  # [G, 1]
    above = others[0] - lowest * others[2]  # Σ w (r − f)
    below = others[1] - lowest * others[2]  # Σ w (r̄ − f)
    ratio = torch.where(below > 1e-12 * others[2].clamp(min=1e-300), above / below.clamp(min=1e-300), 1.0)  # [G, k]
    return kind, per_response(ratio.float(), layout)


def state_kinds(batch: RolloutBatch) -> torch.Tensor:
    """``[N, T]`` int64 bin of each token's ``1 − Σπ²`` among ``KAPPA_EDGES`` (``torch.bucketize``'s
    bins: ``edge[k−1] < x ≤ edge[k]``), counted as the edges below it: one comparison per
    edge is 2–3× faster than a binary search per token on CPU."""
    assert batch.sum_pi_squared is not None
    spread = 1 - batch.sum_pi_squared  # [N, T] float32
    count = torch.zeros(spread.shape, dtype=torch.uint8, device=batch.device)
    above = torch.empty(spread.shape, dtype=torch.bool, device=batch.device)
    for edge in torch.tensor(KAPPA_EDGES, dtype=spread.dtype, device=batch.device):
        count.add_(torch.gt(spread, edge, out=above).view(torch.uint8))  # same bytes: no conversion
    return count.long()


def _other_groups_floor(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` the lowest reward outside each group (0 when the batch has one group: the
    ratio is then 1 and the origin does not matter)."""
    layout = batch.groups
    lowest = group_extreme(batch.rewards.double(), layout, "amin", empty=torch.inf)  # [G]
    if layout.count < 2:
        return torch.zeros_like(lowest)
    two = lowest.topk(2, largest=False)
    return torch.where(torch.arange(layout.count, device=batch.device) == two.indices[0], two.values[1], two.values[0])


def _others_share(batch: RolloutBatch, weights: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` float32 ``1 − W_i,t / Σ_j W_j,t`` over the group's responses running at t
    (W the cumulative weights; ``weights`` is overwritten with them; ``real`` the float32
    mask)."""
    layout = batch.groups
    cumulative = weights.cumsum_(dim=1).float().mul_(real)  # [N, T] (same-dtype product: the fast path)
    total = group_sum(cumulative, layout).clamp_(min=1e-30)  # [G, T]
    if layout.uniform_size:  # broadcast over each group's K rows instead of copying [G, T] to [N, T]
        cumulative.view(layout.count, layout.uniform_size, -1).div_(total.unsqueeze(1))
    else:
        cumulative.div_(per_response(total, layout))
    return cumulative.neg_().add_(1)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_otb", TreeOTB())
