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
from leaf_plugins.estimators.otb import real_tokens, stable_token_weights
from leaf_plugins.estimators.scratch import scratch

__all__ = ["TreeOTB", "KAPPA_EDGES", "LANES", "value_ratios", "state_slots"]

KAPPA_EDGES = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)
"""Bin edges on a state's ``1 − Σπ²``: near-deterministic states first, decisions last."""

LANES = 8
"""Accumulator lanes of the per-kind weight sums: token t adds to lane ``t mod LANES``, so
that successive tokens of one kind do not wait on each other's additions (one lane:
3.5× slower on CPU, where most tokens of a response fall in one or two kinds)."""

_EDGE_BITS = torch.tensor(KAPPA_EDGES, dtype=torch.float32).view(torch.int32).tolist()
"""The float32 edges' bit patterns, as ``state_kinds`` compares them."""


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
            weights, spread = stable_token_weights(batch, real)  # [N, T] w (0 on padding), 1 − Σπ² (scratch)
            slot = state_slots(spread)  # [N, T] int64 kind of state, per accumulator lane
            lowest = _other_groups_floor(batch)  # [G] f
            ratios = value_ratios(batch, weights, slot, lowest)  # [N, LANES · kinds] κ
            floor = per_response(lowest, layout)  # [N]
            scale = per_response(group_scale(batch, params), layout)  # [N]
            # A = (1 − share) · ((r − f) − κ (V̂ − f)) / c: the per-response and per-segment
            # parts first, then four [N, T] passes
            above = ((batch.rewards.double() - floor) / scale).float().unsqueeze(1)  # [N, 1]
            values = ((baselines.values - floor.unsqueeze(1)) / scale.unsqueeze(1)).float()  # [N, D+1]
            advantage = baselines.paint(values, batch.width)  # [N, T] float32 (V̂ − f) / c
            kappa = torch.gather(ratios, 1, slot, out=scratch("tree_otb kappa", tuple(slot.shape), ratios.dtype,
                                                               batch.device))  # [N, T]
            torch.addcmul(above, kappa, advantage, value=-1, out=advantage)
            if params.own_share:
                factor = _others_share(batch, weights, real)
            else:  # a response alone has no other to learn from: 0, as with its own share
                factor = real.mul_((per_response(layout.sizes, layout) > 1).unsqueeze(1))
        return torch.mul(advantage, factor)  # [N, T], 0 on padding: an ordinary tensor, out of inference mode


def value_ratios(batch: RolloutBatch, weights: torch.Tensor, slot: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """``[N, LANES · kinds]`` float32 κ of each response's group for every kind of state
    (repeated in every lane), from the other groups (see the module), measured from each
    group's ``floor [G]``: a token's κ is ``ratios.gather(1, slot)`` (``slot [N, T]`` of
    ``state_slots``).

    Rewards are constant along a response, so each response's weight per kind,
    ``Σ_t w [kind]`` ``[N, kinds]``, is all the ``[N, T]`` data needed. It is summed in
    float32 (at most T positive terms: a relative error below ``T · 2⁻²⁴``, 6e-5 at
    T = 1024, far less in practice, and the same in κ's numerator and denominator); the
    sums over responses and groups, where cancellation can happen, in float64.
    """
    layout = batch.groups
    kinds = len(KAPPA_EDGES) + 1
    lanes = torch.zeros(batch.size, LANES * kinds, dtype=weights.dtype, device=batch.device)
    lanes.scatter_add_(1, slot, weights)  # [N, LANES · kinds]
    per_response_weight = lanes.view(batch.size, LANES, kinds).sum(dim=1).double()  # [N, kinds] Σ_t w per kind
    rewards = batch.rewards.double().unsqueeze(1)  # [N, 1]
    mean = per_response(group_mean(batch.rewards.double(), layout), layout).unsqueeze(1)
    sums = torch.stack([group_sum(per_response_weight * term, layout) for term in (rewards, mean, 1.0)])  # [3, G, k]
    others = sums.sum(dim=1, keepdim=True) - sums  # every group but this one
    lowest = floor.unsqueeze(1)  # [G, 1]
    above = others[0] - lowest * others[2]  # Σ w (r − f)
    below = others[1] - lowest * others[2]  # Σ w (r̄ − f)
    ratio = torch.where(below > 1e-12 * others[2].clamp(min=1e-300), above / below.clamp(min=1e-300), 1.0)  # [G, k]
    return per_response(ratio.float(), layout).repeat(1, LANES)


def state_slots(spread: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` int64 ``kind + kinds · (t mod LANES)`` of every token, in the scratch
    buffer ``"tree_otb slot"``: the bin ``kind`` of the state's ``spread [N, T]`` (float32
    ``1 − Σπ²``) among ``KAPPA_EDGES`` (``torch.bucketize``'s bins:
    ``edge[k−1] < x ≤ edge[k]``), in the token's accumulator lane (``LANES``).

    A kind is counted as the edges below it, comparing the float32 bit patterns as int32:
    for ``x >= 0`` they order as the values, and a negative ``x`` (or −0) has a negative
    pattern, below every edge, as its value is. Same-dtype int32 compares are vectorised;
    a float compare into a bool mask is not (4× slower here), and a binary search per
    token (``bucketize``) is 5× slower than all seven compares.
    """
    shape = tuple(spread.shape)
    bits = spread.view(torch.int32)  # [N, T]
    count = scratch("tree_otb kind count", shape, torch.int32, spread.device)
    above = scratch("tree_otb kind above", shape, torch.int32, spread.device)
    lane = torch.arange(shape[1], dtype=torch.int32, device=spread.device).remainder_(LANES)  # [T]
    count.copy_(lane.mul_(len(KAPPA_EDGES) + 1).expand(shape))
    for edge in _EDGE_BITS:
        count.add_(torch.gt(bits, edge, out=above))
    return scratch("tree_otb slot", shape, torch.int64, spread.device).copy_(count)


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
    (W the cumulative weights), 0 on padding (``real`` the float32 mask); written over
    ``weights``. float32 throughout: ``W`` sums at most T positive weights (relative
    error below ``T · 2⁻²⁴``)."""
    layout = batch.groups
    cumulative = weights.cumsum_(dim=1).mul_(real)  # [N, T]
    total = group_sum(cumulative, layout).clamp_(min=1e-30)  # [G, T]
    if layout.uniform_size:  # broadcast over each group's K rows instead of copying [G, T] to [N, T]
        cumulative.view(layout.count, layout.uniform_size, -1).div_(total.unsqueeze(1))
    else:
        cumulative.div_(per_response(total, layout))
    return torch.sub(real, cumulative, out=cumulative)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_otb", TreeOTB())
