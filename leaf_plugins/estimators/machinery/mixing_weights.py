"""How much of one advantage to mix into another, per kind of state, learnt from the
other groups of the batch (``tree_otb``'s ``tree_weight: auto``).

The advantages are ``A(λ) = e + λ_k d`` (``e`` the base advantage, ``d`` the move toward
the other one, ``λ_k`` one weight per kind ``k`` of state). A group's policy-gradient
estimate is ``ĝ = Σ_j Σ_t A_{j,t} ∇log π(a_{j,t} | s_{j,t})``; tokens in different states
have gradients in different rows of a tabular policy, and two tokens in one state ``s``
have scores whose inner product is known from the policy's probabilities alone:
``⟨∇log π(a|s), ∇log π(b|s)⟩ = [a = b] − π(a|s) − π(b|s) + Σ_v π(v|s)²`` (softmax
logits). So ``|ĝ|²`` is a quadratic in the ``λ_k``:

    Q(λ) = Σ_k (E_k + 2 λ_k N_k + λ_k² D_k),   N_k = Σ_{tokens of kind k} d_{j,t} (K e)_{j,t}

with ``(K y)_{j,t} = Σ_{l ∈ S(j,t)} y_{l,t} ⟨score_j, score_l⟩`` over the responses of the
state (``kernel_statistics``: class sums by scans over the group's lexicographic
order, the rest of each state one term per pair of responses). As the baselines do not change the expected gradient, ``Q`` is
its variance plus a constant: the weights that minimise it minimise the variance.

Each group measures the others' choice: for group ``g``, ``λ_k`` minimises the sum over
the *other* groups ``h`` of ``Q_h(λ) / Q_h(0)`` (each group's variance relative to its
own size, since what counts is each group's gradient direction, not the largest group's),

    λ_k = −Σ_{h≠g} N_{h,k} / Z_h  /  Σ_{h≠g} D_{h,k} / Z_h,    Z_h = Q_h(0),

less ``CONFIDENCE`` times its standard error over those groups, clipped to ``[0, 1]``, and
0 where fewer than ``MIN_GROUPS`` of them carry the kind. Neither depends on group
``g``'s responses; a group whose rewards are all equal says nothing, so a batch of one
group, or of too few informative ones, gets OTB's advantage (weight 0); a group whose
``Z_h`` is under ``SIZE_FLOOR`` of the batch's largest counts as uninformative too.

In the scores' inner product, ``[a = b] − π_a − π_b + Σπ²`` is ``w_a = 2 u_a − v`` for
``a = b`` and ``u_a + u_b − v − 1`` otherwise, with ``u = 1 − π`` and ``v = 1 − Σπ²``: float32
keeps these where ``π`` is near 1 (``w`` is then about ``(1 − π)²``), and a state whose
responses all took one action gets exactly ``w`` times their sum.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.group_stats import group_sum
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

__all__ = ["kernel_statistics", "cross_fitted_weights", "CONFIDENCE", "MIN_GROUPS", "SIZE_FLOOR", "LANES"]

LANES = 8
"""Accumulator lanes of the per-kind sums (see ``kernel_statistics``)."""

CONFIDENCE = 1.0
"""Standard errors subtracted from each learnt weight: the other groups' estimate of
``λ`` is noisy, and a weight too high costs more than one too low (the measurements in
docs/estimators.md)."""

MIN_GROUPS = 3
"""Other groups that must carry a kind of state (tokens of that kind where the two
advantages differ) before its weight is learnt; with fewer it is 0. A fit on one or two
groups has no usable standard error, and such weights cost the most (docs/estimators.md)."""


SIZE_FLOOR = 1e-4
"""A group whose ``Z_h = Q_h(0)`` is at most this share of the batch's largest says
nothing: its OTB advantages are under 1% of the largest group's (rewards nearly
equal), where their float32 rounding (about 6e-8 of the rewards' scale) is no longer
small against them, and dividing by ``Z_h`` would let that noise move every weight
(measured: with 1e-6 a group at 1.8e-6 moved a learnt weight from 0.102 to 0.108)."""


@torch.inference_mode()
def kernel_statistics(batch: RolloutBatch, prefixes: SortedPrefixes, shared: torch.Tensor, partners: torch.Tensor,
                      base: torch.Tensor, move: torch.Tensor, u: torch.Tensor, v: torch.Tensor, kinds: torch.Tensor,
                      count: int) -> torch.Tensor:
    """``[G, count, 3]`` float64 per group and kind: ``Σ d (K e)``, ``Σ d (K d)`` and
    ``Σ e (K e)`` over its tokens of that kind, from the per-token ``base`` ``e`` and
    ``move`` ``d`` (``[N, T]`` float32, 0 on padding), ``u = 1 − π`` of the sampled token
    and ``v = 1 − Σπ²`` of its state (``[N, T]`` float32, 0 on padding) and ``kinds``
    (``[N, T]`` int64 in ``[0, count)``); ``prefixes`` is the lexicographic order and
    ``shared``, ``partners`` (``[N, K]`` each) are ``shared_prefix_lengths``.

    ``(K y)_{j,t} = w Σ_class y + (u − v − 1) Σ_{state, not class} y + Σ_{state, not class} u y``
    (``w = 2u − v``, the same for the whole class: same state, same action). The class
    part: in the lexicographic order a class at ``t`` is a run of slots, sorted slot
    ``k + 1`` joining slot ``k``'s run iff the two share more than ``t`` tokens; its sums
    are a forward scan over the ``K`` slots (the sum of the run so far) and a backward one
    (a slot in the next slot's run takes that run's sum), each step a whole ``[G, T]``
    slice (no loop over groups). The rest of the state: partner ``l`` is in ``j``'s state
    but not its class exactly at the position where the two part, so that part is one
    term per pair of responses, ``[N, K]``.

    Each response's sums over its ``T`` tokens are float32 (a relative error below
    ``T · 2⁻²⁴`` of the sum of the terms' sizes); the sums over responses and groups,
    float64."""
    rows, width = base.shape
    groups, slots = prefixes.groups, shared.shape[1]  # K from a shape: no host synchronisation
    # ---- the class part, in the sorted layout [G, K, T]
    order = torch.full((groups, slots), -1, dtype=torch.int64, device=base.device)
    order.index_put_((prefixes.group, prefixes.slot), prefixes.order)
    order = order.view(-1)  # [G·K] batch row of each sorted slot (-1: empty)
    filled = (order >= 0).to(base.dtype).view(1, groups, slots, 1)  # [1, G, K, 1]
    order = order.clamp(min=0)
    weight = (2 * u - v).clamp_(min=0)  # [N, T] w = 2(1 − π) − (1 − Σπ²), as stable_token_weights
    pairs = base.new_empty(2, groups * slots, width)  # [2, G·K, T] e, d in the sorted layout
    torch.index_select(base, 0, order, out=pairs[0])
    torch.index_select(move, 0, order, out=pairs[1])
    pairs = pairs.view(2, groups, slots, width)
    if not batch.groups.uniform_size:  # zero rows for empty slots
        pairs.mul_(filled)
    weight = weight.index_select(0, order).view(groups, slots, width)  # [G, K, T]
    positions = torch.arange(width, device=base.device)
    joins = (prefixes.gap_matrix.unsqueeze(2) > positions).to(base.dtype)  # [G, K-1, T]: slot k+1 in k's class
    for slot in range(1, slots):  # in place: each slot gets the sum of its run so far
        pairs[:, :, slot].addcmul_(pairs[:, :, slot - 1], joins[:, slot - 1])
    # at a run's last slot that is the class sum: Σ_{j ∈ C} x_j w Σ_{l ∈ C} y_l = w X_C Y_C, w and the kind read
    # there (a policy's are functions of the prefix through t, the same for the whole class)
    ends = torch.cat([1 - joins, torch.ones_like(joins[:, :1])], dim=1).mul_(weight)  # [G, K, T] w at run ends
    class_e, class_d = pairs.unbind(0)  # [G, K, T] Σ_C e, Σ_C d at the runs' last slots
    weighted_d = class_d * ends
    # an empty slot's terms are 0; token t adds to lane t mod LANES of its kind, so that successive tokens of one
    # kind do not wait on each other's additions (as tree_otb's per-kind sums; one lane: 6x slower on CPU)
    lanes = (positions % LANES) * count  # [T]
    sorted_kinds = kinds.index_select(0, order).add_(lanes).view(1, groups * slots, width)
    products = base.new_empty(3, groups, slots, width)  # [3, G, K, T]
    torch.mul(weighted_d, class_e, out=products[0])
    torch.mul(weighted_d, class_d, out=products[1])
    torch.mul(class_e, ends, out=products[2]).mul_(class_e)
    products = products.view(3, groups * slots, width)
    statistics = torch.zeros(3, groups * slots, LANES * count, dtype=base.dtype, device=base.device)
    statistics.scatter_add_(2, sorted_kinds.expand(3, -1, -1), products)
    per_group = statistics.double().view(3, groups, slots, LANES, count).sum(dim=(2, 3))  # [3, G, count]
    # ---- the rest of the state: one term per pair (j, l) that parts at t = shared < T
    parting = (shared >= 0) & (shared < width)  # [N, K]
    at = shared.clamp(0, max(width - 1, 0))  # [N, K]
    own = (torch.arange(rows, device=base.device).unsqueeze(1) * width + at).view(-1)  # [N·K] (j, t)
    other = (partners * width + at).view(-1)  # [N·K] (l, t)
    flat = [values.reshape(-1) for values in (base, move, u, v)]
    x_e, x_d, u_j, v_j = (values.index_select(0, own).view(rows, -1) for values in flat)  # [N, K] each
    y_e, y_d, u_l = (values.index_select(0, other).view(rows, -1) for values in flat[:3])
    factor = (u_j - v_j - 1 + u_l).mul_(parting)  # [N, K]: (K y) = ((u_j − v_j − 1) + u_l) y_l for y = e, d
    pair_products = torch.stack([x_d * factor * y_e, x_d * factor * y_d, x_e * factor * y_e])  # [3, N, K]
    pair_kinds = kinds.reshape(-1).index_select(0, own).view(rows, -1)  # [N, K]
    by_response = torch.zeros(3, rows, count, dtype=base.dtype, device=base.device)
    by_response.scatter_add_(2, pair_kinds.unsqueeze(0).expand(3, -1, -1), pair_products)
    return (per_group + group_sum(by_response.double().permute(1, 0, 2), batch.groups).permute(1, 0, 2)).permute(1, 2, 0)


@torch.inference_mode()
def cross_fitted_weights(statistics: torch.Tensor, usable: torch.Tensor, confidence: float = CONFIDENCE) -> torch.Tensor:
    """``[G, kinds]`` float64 weights ``λ`` in ``[0, 1]`` of every group and kind, each from
    the other groups' ``statistics`` (``kernel_statistics``) whose ``usable [G]`` is true
    (see the module); 0 where the others say nothing."""
    size = statistics[:, :, 2].sum(dim=1)  # [G] Z_h = Q_h(0)
    largest = torch.where(usable, size, 0.0).max() if size.numel() else size.new_zeros(())
    informative = usable & (size > SIZE_FLOOR * largest)  # [G] (Z_h = 0 when the largest is 0)
    scale = torch.where(informative, 1 / size.clamp(min=1e-300), 0.0).unsqueeze(1)  # [G, 1]
    cross, square = (statistics[:, :, 0] * scale), (statistics[:, :, 1] * scale)  # [G, kinds] N/Z, D/Z

    def others(values: torch.Tensor) -> torch.Tensor:
        return values.sum(dim=0, keepdim=True) - values

    below = others(square)
    informed = (below > 1e-12) & (others((square > 1e-9).double()) >= MIN_GROUPS)
    fitted = torch.where(informed, -others(cross) / below.clamp(min=1e-300), 0.0)  # [G, kinds]
    # the spread of the groups' residuals N_h + λ D_h about the fit: its standard error
    residual = others(cross * cross) + 2 * fitted * others(cross * square) + fitted * fitted * others(square * square)
    error = torch.where(informed, residual.clamp(min=0).sqrt() / below.clamp(min=1e-300), 0.0)
    return (fitted - confidence * error).clamp_(min=0, max=1)
