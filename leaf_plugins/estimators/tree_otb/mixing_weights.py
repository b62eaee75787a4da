"""How much of one advantage to mix into another, learnt from the responses of the call
(``tree_otb``'s ``tree_weight: auto``).

The advantages are ``A(λ) = e + λ d`` (``e`` the base advantage, ``d`` the move toward
the other one, ``λ`` one weight). A group's policy-gradient estimate is
``ĝ = Σ_j Σ_t A_{j,t} ∇log π(a_{j,t} | s_{j,t})``; tokens in different states have
gradients in different rows of a tabular policy, and two tokens in one state ``s`` have
scores whose inner product is known from the policy's probabilities alone:
``⟨∇log π(a|s), ∇log π(b|s)⟩ = [a = b] − π(a|s) − π(b|s) + Σ_v π(v|s)²`` (softmax
logits). So ``|ĝ|²`` is a quadratic in ``λ``:

    Q_g(λ) = E_g + 2 λ N_g + λ² D_g,   N_g = Σ_j Σ_t d_{j,t} (K e)_{j,t}

with ``(K y)_{j,t} = Σ_{l ∈ S(j,t)} y_{l,t} ⟨score_j, score_l⟩`` over the responses of the
state (``kernel_terms``: class sums by a scan over the group's lexicographic order, the
rest of each state one term per pair of responses). As the baselines do not
change the expected gradient, ``Q`` is its variance plus a constant: the weight that
minimises it minimises the variance.

The same quadratic, fitted on a group's own responses, would pick the weight that cancels
the group's own signal along the move (``|ĝ|²`` is the variance *plus* ``|∇J|²``, and one
realisation of ``⟨∇J, ĝ_d⟩`` is as large as the noise where the estimate is good). So
each group's coefficients are those of an estimate of the *variance* alone: with ``ĝ``
a sum of ``K`` response terms ``X_j``, ``Σ_j |X_j|²`` (the *diagonal*: each token with
itself) estimates ``K E|X|²`` and the cross terms ``Σ_{j≠l} ⟨X_j, X_l⟩`` estimate
``K (K − 1) |E X|²``, so

    V_g(λ) = diag_g(λ) − offdiag_g(λ) / (K − 1) = (K · diag_g(λ) − Q_g(λ)) / (K − 1)

(exact in expectation for independent terms; a response's baseline reads the others'
rewards, so only close). The weight is fitted once per call on every group that has
something to say, each divided by its own ``Z_g = Q_g(0)`` (what counts is each group's
gradient direction, not the largest group's):

    λ̂ = −Σ_g N^V_g / Z_g  /  Σ_g D^V_g / Z_g,

less ``CONFIDENCE`` times its standard error, clipped to ``[0, 1]``. The standard error
comes from the spread of the fit's residuals ``n_u + λ̂ d_u`` over its *units*, each
with its coefficient in ``V``: the terms of one prefix class at one position (a state's
responses that took one action, ``w D_C E_C``) and of one pair of responses where they
part (``x_j k_{jl} y_l``), both ``−1/(K − 1)``, and of one token with itself
(``w d e``), ``K/(K − 1)``. A call of one group fits on its own responses, so a training
step with one prompt, or an evaluation that estimates group by group, learns what the
group can tell; where the fit is weak against its noise (exact-match rewards, groups of
a few responses), the margin keeps ``λ`` at 0, OTB's advantage. The fit reads the
call's own rewards: the weight is not independent of the responses it weighs (a small
bias, measured in docs/estimators.md), the price of not needing other groups. A group
whose rewards are all equal says nothing, and nor does one whose ``Z_g`` is under
``SIZE_FLOOR`` of the call's largest.

In the scores' inner product, ``[a = b] − π_a − π_b + Σπ²`` is ``w_a = 2 u_a − v`` for
``a = b`` and ``u_a + u_b − v − 1`` otherwise, with ``u = 1 − π`` and ``v = 1 − Σπ²``: float32
keeps these where ``π`` is near 1 (``w`` is then about ``(1 − π)²``), and a state whose
responses all took one action gets exactly ``w`` times their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import GroupLayout, RolloutBatch, group_sum
from leaf_plugins.estimators.machinery.group_stats import per_response
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes
from leaf_plugins.estimators.machinery.scratch import scratch

__all__ = ["KernelTerms", "kernel_terms", "pooled_weight", "CONFIDENCE", "SIZE_FLOOR", "BELOW_FLOOR"]

CONFIDENCE = 1.0
"""Standard errors subtracted from the fitted weight: the fit is noisy, and a weight too
high costs more than one too low (docs/estimators.md)."""

SIZE_FLOOR = 1e-4
"""A group whose ``Z_g = Q_g(0)`` is at most this share of the call's largest says
nothing: its OTB advantages are under 1% of the largest group's (rewards nearly
equal), where their float32 rounding (about 6e-8 of the rewards' scale) is no longer
small against them, and dividing by ``Z_g`` would let that noise move the weight."""

BELOW_FLOOR = 1e-4
"""``Σ_g D^V_g / Z_g`` at or below which ``λ`` is 0: the move changes the groups' gradients
by about 1% of their size or less, too little to matter for the variance, and its
coefficients are then mostly float32 rounding (the score weights ``w`` of
near-deterministic tokens, about ``(1 − π)²``, are known to ``2⁻²⁴ / (1 − π)`` of
themselves): the fitted weight would move with the rewards' scale."""


@dataclass(frozen=True)
class KernelTerms:
    """The units of ``Q``'s coefficients, each a triple ``(d (K e), d (K d), e (K e))``
    (float32): ``classes [3, G, K, T]`` one per prefix class and position, at the class's
    last slot in the lexicographic order (0 elsewhere), and ``pairs [3, N, K]`` one per
    response and partner where the two part (0 elsewhere); and the diagonal,
    ``diagonal [2, G, K, T]`` one per token with itself (``w (d e, d d)``: the variance's
    coefficients need no ``w e e``), which the class units include, in the sorted layout
    of ``classes`` (0 for an empty slot). ``classes`` and ``diagonal`` are scratch
    buffers: valid until the next ``kernel_terms`` call in this thread."""

    classes: torch.Tensor
    pairs: torch.Tensor
    diagonal: torch.Tensor


@torch.inference_mode()
def kernel_terms(batch: RolloutBatch, prefixes: SortedPrefixes, shared: torch.Tensor, partners: torch.Tensor,
                 base: torch.Tensor, move: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> KernelTerms:
    """The terms of ``Σ d (K e)``, ``Σ d (K d)`` and ``Σ e (K e)`` over a call's tokens,
    from the per-token ``base`` ``e`` and ``move`` ``d`` (``[N, T]`` float32, 0 on
    padding), the score weight ``w = 2u − v`` of the sampled token (at least 0, as
    ``otb.stable_token_weights``; ``u = 1 − π``) and ``v = 1 − Σπ²`` of its state
    (``[N, T]`` float32, 0 on padding); ``prefixes`` is the lexicographic order and
    ``shared``, ``partners`` (``[N, K]`` each) are ``shared_prefix_lengths``.

    ``(K y)_{j,t} = w Σ_class y + (u − v − 1) Σ_{state, not class} y + Σ_{state, not class} u y``
    (``w = 2u − v``, the same for the whole class: same state, same action). The class
    part: in the lexicographic order a class at ``t`` is a run of slots, sorted slot
    ``k + 1`` joining slot ``k``'s run iff the two share more than ``t`` tokens; its sums
    are a forward scan over the ``K`` slots (the sum of the run so far), each step a whole
    ``[G, T]`` slice (no loop over groups), and the class's term ``w X_C Y_C`` is read at
    the run's last slot. The rest of the state: partner ``l`` is in ``j``'s state but not
    its class exactly at the position where the two part, so that part is one term per
    pair of responses, ``[N, K]``."""
    rows, width = base.shape
    groups, slots = prefixes.groups, shared.shape[1]  # K from a shape: no host synchronisation
    device = base.device
    # ---- the class part, in the sorted layout [G, K, T]; the large tensors live in scratch buffers
    order = torch.full((groups, slots), -1, dtype=torch.int64, device=device)
    order.index_put_((prefixes.group, prefixes.slot), prefixes.order)
    order = order.view(-1)  # [G·K] batch row of each sorted slot (-1: empty)
    filled = (order >= 0).to(base.dtype).view(1, groups, slots, 1)  # [1, G, K, 1]
    order = order.clamp(min=0)
    # e and d in the sorted layout and a spare slab: the class products are written over the three (below)
    slabs = scratch("kernel_terms slabs", (3, groups * slots, width), base.dtype, device)
    torch.index_select(base, 0, order, out=slabs[0])
    torch.index_select(move, 0, order, out=slabs[1])
    slabs = slabs.view(3, groups, slots, width)
    sums = slabs[:2]  # [2, G, K, T]
    if not batch.groups.uniform_size:  # zero rows for empty slots
        sums.mul_(filled)
    ends = scratch("kernel_terms ends", (groups * slots, width), base.dtype, device)  # w at the runs' last slots
    torch.index_select(w, 0, order, out=ends)
    ends = ends.view(groups, slots, width)
    # each token with itself, from the sorted copies while they are at hand (the scan overwrites them)
    diagonal = scratch("kernel_terms diagonal", (2, groups, slots, width), base.dtype, device)
    torch.mul(sums[1], ends, out=diagonal[1])  # w d
    torch.mul(diagonal[1], sums[0], out=diagonal[0])
    diagonal[1].mul_(sums[1])
    # float compares into float masks (vectorised; positions and gaps are exact in float32 below 2^24)
    positions = torch.arange(width, dtype=base.dtype, device=device)
    gaps = prefixes.gap_matrix.to(base.dtype).unsqueeze(2)  # [G, K-1, 1]
    joins = torch.gt(gaps, positions, out=scratch("kernel_terms joins", (groups, max(slots - 1, 0), width), base.dtype,
                                                    device))  # [G, K-1, T] 1.0 where slot k+1 is in k's class
    columns, links = sums.unbind(2), joins.unbind(1)  # K views [2, G, T], K-1 views [G, T]
    for slot in range(1, slots):  # in place: each slot gets the sum of its run so far
        columns[slot].addcmul_(columns[slot - 1], links[slot - 1])
    # at a run's last slot that is the class sum: Σ_{j ∈ C} x_j w Σ_{l ∈ C} y_l = w X_C Y_C, w read there (a
    # policy's w is a function of the prefix through t, the same for the whole class)
    ends[:, :-1].addcmul_(ends[:, :-1], joins, value=-1)  # 0 where the next slot joins the run (w − w · 1)
    class_e, class_d, spare = slabs.unbind(0)  # [G, K, T] Σ_C e, Σ_C d at the runs' last slots, and the spare slab
    torch.mul(class_e, ends, out=spare).mul_(class_e)  # w E E
    weighted_d = ends.mul_(class_d)  # w D, over w
    class_e.mul_(weighted_d)  # w D E, over the sum it is made of
    class_d.mul_(weighted_d)  # w D D
    # ---- the rest of the state: one term per pair (j, l) that parts at t = shared < T
    parting = (shared >= 0) & (shared < width)  # [N, K]
    at = shared.clamp(0, max(width - 1, 0))  # [N, K]
    own = (torch.arange(rows, device=base.device).unsqueeze(1) * width + at).view(-1)  # [N·K] (j, t)
    other = (partners * width + at).view(-1)  # [N·K] (l, t)
    both = torch.cat([own, other])  # [2 · N·K]
    (x_e, y_e), (x_d, y_d), (u_j, u_l) = (values.reshape(-1).index_select(0, both).view(2, rows, -1)
                                          for values in (base, move, batch.logprobs))  # [N, K] each
    v_j = v.reshape(-1).index_select(0, own).view(rows, -1)  # [N, K]
    u_j, u_l = torch.expm1(torch.stack([u_j, u_l])).neg_()  # [N, K] 1 − π of each one's token (from log π)
    factor = (u_j - v_j - 1 + u_l).mul_(parting)  # [N, K]: (K y) = ((u_j − v_j − 1) + u_l) y_l for y = e, d
    factor = torch.where(factor.isfinite(), factor, 0.0)  # a padding position's log π may be anything
    pairs = torch.stack([x_d * factor * y_e, x_d * factor * y_d, x_e * factor * y_e])  # [3, N, K]
    return KernelTerms(slabs, pairs, diagonal)


@torch.inference_mode()
def pooled_weight(terms: KernelTerms, layout: GroupLayout, usable: torch.Tensor,
                  confidence: float = CONFIDENCE) -> torch.Tensor:
    """``[]`` float64 weight ``λ`` in ``[0, 1]`` fitted on the variance estimates from the
    ``terms`` (``kernel_terms``) of every group whose ``usable [G]`` is true, less
    ``confidence`` standard errors over the terms (see the module); 0 where they carry no
    move. A tensor, not a number: no host synchronisation. The residuals are written over
    the units' first rows (``terms.classes[0]``, ``terms.pairs[0]``, ``terms.diagonal[0]``).

    Each group's sums over its class and diagonal terms are float32 per slot (at most
    ``T`` terms: a relative error below ``T · 2⁻²⁴`` of their sizes), the rest float64."""
    class_sums = terms.classes.sum(dim=3).double().sum(dim=2)  # [3, G]
    pair_sums = group_sum(terms.pairs.sum(dim=2).double().T, layout).T  # [3, G]
    diagonal_sums = terms.diagonal.sum(dim=3).double().sum(dim=2)  # [2, G]
    full = class_sums + pair_sums  # [3, G]: N_g, D_g, Z_g = Q_g(0)
    size = full[2]
    responses = layout.sizes.double()  # [G] K
    others = (responses - 1).clamp(min=1)
    cross, square = ((responses * diagonal_sums - full[:2]) / others).unbind(0)  # [G] each: N^V_g, D^V_g
    largest = torch.where(usable, size, 0.0).max() if size.numel() else size.new_zeros(())
    informative = usable & (size > SIZE_FLOOR * largest)  # [G] (Z_g = 0 when the largest is 0)
    scale = torch.where(informative, 1 / size.clamp(min=1e-300), 0.0)  # [G] 1 / Z_g
    below = (square * scale).sum()
    carried = below > BELOW_FLOOR
    fitted = torch.where(carried, -(cross * scale).sum() / below.clamp(min=1e-300), 0.0)
    # the spread of the units' residuals n + λ̂ d about the fit, each with its coefficient in V_g / Z_g
    step = fitted.float()
    shared = -scale / others  # [G] a class's or a pair's coefficient
    alone = scale * responses / others  # [G] a token's with itself

    def squares(units: torch.Tensor, coefficient: torch.Tensor) -> torch.Tensor:
        """Σ (coefficient · (n + λ̂ d))² over the units ``(n, d, …) = units [2 or 3, R, ...]``,
        ``coefficient [R]`` one per row; the residuals are written over ``n`` (in the cache
        already, and no other buffer)."""
        residuals = units[0].addcmul_(units[1], step)  # n + λ̂ d
        sizes = torch.linalg.vector_norm(residuals, dim=tuple(range(1, residuals.dim())))  # [R] float32, as above
        return (sizes.double() * coefficient).square().sum()

    residual = (squares(terms.classes, shared)
                + squares(terms.pairs, per_response(shared, layout))
                + squares(terms.diagonal, alone))
    error = residual.sqrt() / below.clamp(min=1e-300)
    return torch.where(carried, fitted - confidence * error, 0.0).clamp(min=0, max=1)
