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
from leaf_plugins.estimators.tree_baselines import path_baselines
from leaf_plugins.estimators.tree_rloo import TreeRLOO, group_scale
from leaf_plugins.estimators.otb import token_weights

__all__ = ["TreeOTB", "KAPPA_EDGES", "value_ratios"]

KAPPA_EDGES = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)
"""Bin edges on a state's ``1 − Σπ²``: near-deterministic states first, decisions last."""


class TreeOTB(TreeRLOO):
    """Tree OTB: prefix leave-one-out values scaled to the variance-optimal baseline."""

    parameters = TreeRLOO.parameters | {"own_share"}

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: EstimatorParams) -> torch.Tensor:
        with torch.inference_mode():
            weights = token_weights(batch, dtype=torch.float64).clone()  # [N, T] w = 1 − 2π + Σπ², 0 on padding
        baselines = path_baselines(batch, nodes, params.shrink)
        value = baselines.paint(baselines.values, batch.width)  # [N, T] float64 V̂
        with torch.inference_mode():
            layout = batch.groups
            floor = _other_groups_floor(batch)  # [G]
            ratio = value_ratios(batch, weights, floor)  # [N, T]
            origin = per_response(floor, layout).unsqueeze(1)  # [N, 1]
            baseline = origin + ratio * (value - origin)
            advantage = batch.rewards.double().unsqueeze(1) - baseline  # [N, T]
            if params.own_share:
                advantage = advantage * (1 - _own_share(batch, weights))
            else:  # a response alone has no other to learn from: 0, as with its own share
                advantage = advantage * (per_response(layout.sizes, layout) > 1).unsqueeze(1)
            advantage = advantage / per_response(group_scale(batch, params), layout).unsqueeze(1)
            result = torch.where(batch.mask, advantage, 0.0).float()
        return result.clone()


def value_ratios(batch: RolloutBatch, weights: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` float64 κ of every token (see the module), from the other groups."""
    layout = batch.groups
    assert batch.sum_pi_squared is not None
    edges = torch.tensor(KAPPA_EDGES, dtype=torch.float64, device=batch.device)
    kind = torch.bucketize(1 - batch.sum_pi_squared.double(), edges)  # [N, T]
    kinds = len(KAPPA_EDGES) + 1
    rewards = batch.rewards.double().unsqueeze(1)  # [N, 1]
    mean = per_response(group_mean(batch.rewards.double(), layout), layout).unsqueeze(1)
    slot = (per_response(torch.arange(layout.count, device=batch.device), layout).unsqueeze(1) * kinds + kind)
    sums = torch.zeros(3, layout.count * kinds, dtype=torch.float64, device=batch.device)
    for row, term in enumerate((weights * rewards, weights * mean, weights)):  # Σ w r, Σ w r̄, Σ w per (group, kind)
        sums[row].index_add_(0, slot.reshape(-1), term.reshape(-1))
    sums = sums.view(3, layout.count, kinds)
    others = sums.sum(dim=1, keepdim=True) - sums  # [3, G, kinds]: every group but this one
    lowest = floor.unsqueeze(1)  # [G, 1]
    above = others[0] - lowest * others[2]  # Σ w (r − f)
    below = others[1] - lowest * others[2]  # Σ w (r̄ − f)
    ratio = torch.where(below > 1e-12 * others[2].clamp(min=1e-300), above / below.clamp(min=1e-300), 1.0)
    return ratio.view(-1).take(slot)  # [N, T]


def _other_groups_floor(batch: RolloutBatch) -> torch.Tensor:
    """``[G]`` the lowest reward outside each group (0 when the batch has one group: the
    ratio is then 1 and the origin does not matter)."""
    layout = batch.groups
    lowest = group_extreme(batch.rewards.double(), layout, "amin", empty=torch.inf)  # [G]
    if layout.count < 2:
        return torch.zeros_like(lowest)
    two = lowest.topk(2, largest=False)
    return torch.where(torch.arange(layout.count, device=batch.device) == two.indices[0], two.values[1], two.values[0])


def _own_share(batch: RolloutBatch, weights: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` W_i,t / Σ_j W_j,t over the group's responses running at t (W cumulative)."""
    cumulative = weights.cumsum(dim=1) * batch.mask  # [N, T]
    total = per_response(group_sum(cumulative, batch.groups), batch.groups)  # [N, T]
    return torch.where(total > 0, cumulative / total.clamp(min=1e-300), 0.0)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_otb", TreeOTB())
