"""Tree OTB: a variance-aware prefix baseline (see docs/estimators.md, ``tree_otb``).

The baseline that minimises the policy gradient's variance at a state ``s`` is
``b*(s) = E[w Q(s, a)] / E[w]`` with ``w = 1 − 2π(a|s) + Σπ²``: where rare tokens cost
reward (a wrong word), it sits below the state's value ``V(s)``. Tree OTB estimates it
for response ``i`` as ``b = f + κ · (V̂(s) − f)``:

* ``V̂(s)``: the shrunk leave-one-out value of the deepest retained node on the
  response's path at or before the token (``tree_baselines``), the others that share its
  prefix;
* ``κ``: how far below the value the score-weighted return lies, for states of the
  token's kind, learnt from *every other response* of the call (its own group's others
  and the other groups'):
  ``κ = Σ_j (w + ridge) (r_j − f) / Σ_j (w + ridge) (r̄_{g(j)} − f)`` over their tokens whose
  state has a similar ``1 − Σπ²`` (bins ``KAPPA_EDGES``), ``r̄_{g(j)}`` the mean reward of
  ``j``'s group without response ``i``; 1 where no other response weighs in. ``ridge`` 0
  weighs by the score's squared norm alone (the variance-optimal baseline); a ridge also
  weighs every token's squared advantage, which pulls the baseline of near-deterministic
  states (``w`` ≈ 0) toward their value and keeps their advantages small (``RIDGE``,
  chosen by the credit benchmark);
* ``f``: the lowest reward of the other responses (the origin of the ratio, so that
  shifting all rewards shifts the baseline with them).

None of these depends on response ``i``'s own tokens from the token on or on its reward:
the baseline is unbiased. With ``own_share`` (the default), the advantage is then
multiplied by ``1 − W_i,t / Σ_j W_j,t`` (``W`` the cumulative weights of the group's
responses still running), which is verl's OTB including the response's own return in
its baseline: a bias that shrinks the advantages of high-variance paths.

With ``prefix_mean`` (the default) every token gets the mean of that advantage over the
responses that share its prefix through it (``prefix_intervals``): the same batch
gradient, without the part of the advantage that only says which continuation the
response took.

The result moves from OTB's advantage toward that one by ``tree_weight`` ``λ``: a number,
or (``auto``) one weight fitted on the call's responses to minimise the gradient's
variance (``mixing_weights``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import torch

from leaf_plugins.core.batch import RolloutBatch, group_sum
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.tree import Boundaries, Nodes
from leaf_plugins.estimators.machinery.group_stats import by_group, group_extreme, per_response
from leaf_plugins.estimators.machinery.node_shrinkage import group_scale, node_shrink
from leaf_plugins.estimators.machinery.nodes import boundary_nodes
from leaf_plugins.estimators.machinery.path_variance import (RunningWeights, real_tokens, replaced_reward_advantages,
                                                             running_weights, stable_token_weights)
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes
from leaf_plugins.estimators.machinery.scratch import scratch
from leaf_plugins.estimators.machinery.tree_baselines import path_baselines
from leaf_plugins.estimators.parameters import TreeRLOOParams
from leaf_plugins.estimators.tree_otb.mixing_weights import kernel_terms, pooled_weight
from leaf_plugins.estimators.tree_otb.prefix_intervals import PathIntervals, path_intervals, shared_prefix_lengths
from leaf_plugins.estimators.tree_rloo import TreeRLOO

__all__ = ["TreeOTB", "TreeOTBParams", "KAPPA_EDGES", "LANES", "value_ratios", "state_kinds"]

KAPPA_EDGES = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)
"""Bin edges on a state's ``1 − Σπ²``: near-deterministic states first, decisions last."""

RIDGE = 0.025
"""The default ``ridge``: the weight every token adds to ``w`` in κ's sums (see the module)."""

KINDS = len(KAPPA_EDGES) + 1
"""Kinds of state: the bins of ``KAPPA_EDGES``."""

LANES = 8
"""Accumulator lanes of the per-kind weight sums (``value_ratios``): token t adds to lane
``t mod LANES``, so that successive tokens of one kind do not wait on each other's
additions (one lane: 3.5× slower on CPU, where most tokens of a response fall in one or
two kinds)."""

_EDGE_BITS = torch.tensor(KAPPA_EDGES, dtype=torch.float32).view(torch.int32).tolist()
"""The float32 edges' bit patterns, as ``state_kinds`` compares them."""

_INT32_WORK = "tree_otb int32 work"
"""The scratch buffer of the call's short-lived int32 ``[N, T]`` arrays, one after the
other: the kinds' compares, κ's lanes, the steps the cells are summed from (one buffer
instead of three: a smaller memory footprint per call)."""

_INDEX = "tree_otb index"
"""The scratch buffer of the int64 ``[N, T]`` index: κ's lanes, then the cells."""

_TREE = "tree_otb tree"
"""The scratch buffer of the float32 ``[N, T]`` tree advantages; ``w + ridge`` before
them, until κ is known."""


@dataclass(frozen=True)
class TreeOTBParams(TreeRLOOParams):
    """Tree RLOO's parameters (scaled by the batch's std by default) and the variance-aware baseline's."""

    scale: Literal["group_std", "batch_std", "none"] = field(default="batch_std", metadata={
        "help": "batch_std: divide the advantages by one std pooled over the batch's groups; group_std: by the "
                "group's reward std (as GRPO); none: not at all"})
    own_share: bool = field(default=True, metadata={
        "help": "weigh the response's own return in its baseline by its share of the path-variance weights, "
                "as verl's OTB (biased, lower variance)"})
    prefix_mean: bool = field(default=True, metadata={
        "help": "give each token the mean advantage of the responses that share its prefix through it"})
    ridge: float = field(default=RIDGE, metadata={
        "help": "weight every token adds to its score weight in kappa (0: the variance-optimal baseline; "
                "larger: closer to the state value)"})
    tree_weight: float | Literal["auto"] = field(default="auto", metadata={
        "help": "share of the prefix tree's advantage a token keeps over OTB's: auto (one weight fitted on the "
                "call's responses to lower the gradient's variance) or a number in [0, 1] (1: the tree alone)"})

    def __post_init__(self) -> None:
        if not (0 <= self.ridge < math.inf):
            raise ValueError(f"ridge must be a finite number >= 0, got {self.ridge!r}")
        if self.tree_weight != "auto" and not 0 <= self.tree_weight <= 1:
            raise ValueError(f"tree_weight must be 'auto' or a number in [0, 1], got {self.tree_weight!r}")
        super().__post_init__()


class TreeOTB(TreeRLOO):
    """Tree OTB: OTB's advantage moved toward the prefix tree's as far as the call's
    responses say it lowers the gradient's variance."""

    parameters = TreeOTBParams
    requires = {"select_boundaries": ("surprisal",), "compute_advantages": ("logprobs", "sum_pi_squared")}
    spans = "call"  # κ and the fitted tree weight learn from every response of the call

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: TreeOTBParams) -> Nodes:
        if _reads_order(batch, params):  # the advantages need the lexicographic order: read the classes off it
            return boundary_nodes(batch, boundaries.positions, params.min_group, SortedPrefixes.of(batch))
        return super().retain_nodes(batch, boundaries, params)

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: TreeOTBParams) -> torch.Tensor:
        baselines = path_baselines(batch, nodes, node_shrink(batch, nodes, params))  # segment values V̂ [N, D+1]
        learnt = params.tree_weight == "auto"
        mixed = params.tree_weight != 1  # OTB's advantage takes part
        with torch.inference_mode():
            layout = batch.groups
            shape, device = tuple(batch.tokens.shape), batch.device
            real = real_tokens(batch)  # [N, T] float32 1.0 / 0.0
            weights, spread = stable_token_weights(batch, real)  # [N, T] w, 1 − Σπ² (0 on padding; scratch)
            prefixes = SortedPrefixes.of(batch) if _reads_order(batch, params) else None
            shared = None if prefixes is None else shared_prefix_lengths(batch, prefixes)  # [N, K] each
            intervals = path_intervals(batch, baselines.bounds, shared if params.prefix_mean else None)  # E+1 each
            past_end = intervals.segment >= baselines.values.shape[1]  # [N, E+1] the intervals on the padding
            kinds = state_kinds(spread)  # [N, T] int32
            lowest = _other_responses_floor(batch)  # [N] f
            ridged = (torch.add(weights, real, alpha=params.ridge, out=scratch(_TREE, shape, weights.dtype, device))
                      if params.ridge else weights)  # [N, T] w + ridge
            kappa = value_ratios(batch, ridged, kinds, lowest)  # [N, kinds] κ
            scale = per_response(group_scale(batch, params), layout)  # [N] c
            table = _advantage_table(batch, baselines.values, intervals, kappa, lowest, scale, past_end,
                                    params)  # [N, cells]
            cells = intervals.token_cells(kinds, KINDS, scratch(_INT32_WORK, shape, torch.int32, device),
                                          scratch(_INDEX, shape, torch.int64, device))  # [N, T] interval · kinds + kind
            running = (running_weights(batch, weights, real, torch.float32 if params.own_share else torch.float64)
                       if params.own_share or mixed else None)  # W, Σ_j W_j
            if mixed:
                tree = torch.gather(table, 1, cells, out=scratch(_TREE, shape, table.dtype, device))
                otb = _otb_advantages(batch, intervals, cells, running, real, scale, past_end, params)  # [N, T]
            share = _own_share(batch, running) if params.own_share else None  # [N, T] W_i / Σ_j W_j (over W)
            if mixed:
                if share is not None:
                    tree.addcmul_(tree, share, value=-1)
                move = tree.sub_(otb)  # [N, T] from OTB's advantage to the tree's
                weight = (_learnt_weight(batch, prefixes, shared, otb, move, weights, spread) if learnt
                          else move.new_tensor(float(params.tree_weight)))  # [] λ
        # out of inference mode: the result is an ordinary tensor
        if mixed:
            return torch.addcmul(otb, weight, move)  # [N, T] OTB's advantage + λ (tree's − OTB's)
        advantage = torch.gather(table, 1, cells)  # [N, T] class mean of ((r − f) − κ (V̂ − f)) / c, 0 on padding
        return advantage if share is None else advantage.addcmul_(advantage, share, value=-1)


def _as_index(values: torch.Tensor, purpose: str) -> torch.Tensor:
    """The int32 ``values`` as an int64 index (gathers and scatters take no other), in the
    scratch buffer ``purpose``. Index arithmetic runs in int32 first: on the CPU an
    operation that mixes int32 and int64 takes a slow path (5× an int32 one and a copy)."""
    return scratch(purpose, tuple(values.shape), torch.int64, values.device).copy_(values)


def _reads_order(batch: RolloutBatch, params: TreeOTBParams) -> bool:
    """Whether the advantages read the batch's lexicographic order (the prefix classes
    of ``prefix_mean`` or of the learnt weight's kernel)."""
    return (params.prefix_mean or params.tree_weight == "auto") and batch.size > 1


def _otb_advantages(batch: RolloutBatch, intervals: PathIntervals, cells: torch.Tensor, running: RunningWeights,
                    real: torch.Tensor, scale: torch.Tensor, past_end: torch.Tensor,
                    params: TreeOTBParams) -> torch.Tensor:
    """``[N, T]`` float32 OTB's advantage on the ``running`` weights (with its own-return
    share under ``own_share``, the leave-one-out form without) with each token's reward
    replaced by its prefix class's mean reward (the ``cells [N, T]`` of the advantage
    table; ``past_end [N, E+1]``: the intervals on the padding), divided by ``scale [N]``
    (float64 c); 0 for a response alone in its group, as the tree's. In the scratch
    buffer ``"tree_otb otb"`` under ``own_share``."""
    means = intervals.class_means(batch.rewards.double().unsqueeze(1)).squeeze(2)  # [N, E+1] class mean rewards
    per_cell = means.masked_fill_(past_end, 0.0).float().unsqueeze(2).expand(-1, -1, KINDS).reshape(batch.size, -1)
    replaced = torch.gather(per_cell, 1, cells, out=scratch("tree_otb otb", tuple(cells.shape), torch.float32,
                                                               cells.device))  # [N, T], as the table's cells
    advantage = replaced_reward_advantages(batch, replaced, running, real, params.own_share)  # [N, T]
    alone = per_response(batch.groups.sizes, batch.groups) < 2  # [N]
    divisor = torch.where(alone, torch.inf, scale).float().unsqueeze(1)  # [N, 1]
    return advantage.div_(divisor)


def _learnt_weight(batch: RolloutBatch, prefixes: SortedPrefixes | None,
                   shared: tuple[torch.Tensor, torch.Tensor] | None,
                   base: torch.Tensor, move: torch.Tensor, weights: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """``[]`` float32 λ of the call (``mixing_weights``) between OTB's advantage
    ``base [N, T]`` and the tree's ``base + move`` (``weights [N, T]``: the score weights
    ``w``, ``spread [N, T]``: 1 − Σπ²; ``prefixes`` and ``shared``: the lexicographic
    order and ``shared_prefix_lengths``); 0 for a batch of one response (``prefixes``
    None)."""
    if prefixes is None or shared is None:
        return base.new_zeros(())
    layout = batch.groups
    terms = kernel_terms(batch, prefixes, shared[0], shared[1], base, move, weights, spread)
    rewards = batch.rewards.double()
    spread_out = group_extreme(rewards, layout, "amax", -torch.inf) > group_extreme(rewards, layout, "amin", torch.inf)
    return pooled_weight(terms, layout, spread_out).float()


def state_kinds(spread: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` int32 kind of every token's state: the bin of its ``spread [N, T]``
    (float32 ``1 − Σπ²``) among ``KAPPA_EDGES`` (``torch.bucketize``'s bins:
    ``edge[k−1] < x ≤ edge[k]``), in the scratch buffer ``"tree_otb kinds"``.

    Kinds are counted as the edges at or below the token, one int32 compare each, on the
    float32 bit patterns: for ``x >= 0`` they order as the values, and a negative ``x``
    (or −0) has a negative pattern, below every edge, as its value is. Same-dtype int32
    compares are vectorised; a float compare into a bool mask is not (4× slower here),
    and a binary search per token (``bucketize``) is 5× slower than all seven compares.
    """
    shape = tuple(spread.shape)
    count = scratch("tree_otb kinds", shape, torch.int32, spread.device)  # [N, T]
    above = scratch(_INT32_WORK, shape, torch.int32, spread.device)  # [N, T]
    bits = spread.view(torch.int32)
    torch.gt(bits, _EDGE_BITS[0], out=count)
    for edge in _EDGE_BITS[1:]:
        count.add_(torch.gt(bits, edge, out=above))
    return count


def value_ratios(batch: RolloutBatch, weights: torch.Tensor, kinds: torch.Tensor,
                 floor: torch.Tensor) -> torch.Tensor:
    """``[N, kinds]`` float64 κ of each response for every kind of state, from every
    other response of the call (see the module), measured from each response's
    ``floor [N]`` (``kinds [N, T]``: ``state_kinds``).

    Rewards are constant along a response, so each response's weight per kind,
    ``W_j = Σ_t w [kind]`` ``[N, kinds]``, is all the ``[N, T]`` data needed. It is summed in
    float32 (at most T positive terms: a relative error below ``T · 2⁻²⁴``, 6e-5 at
    T = 1024, far less in practice, and the same in κ's numerator and denominator); the
    sums over responses and groups, where cancellation can happen, in float64. Leaving
    response ``i`` out is a subtraction from the call's sums: the numerator
    ``Σ_{j≠i} W_j r_j``, and the denominator's own-group part
    ``(Σ_{j∈g} W_j − W_i) · r̄_{g,−i}`` beside the other groups' ``Σ_{h≠g} Σ_{j∈h} W_j r̄_h``.
    """
    layout = batch.groups
    lanes = _lane_offsets(batch.width, str(batch.device))  # [T]
    slot = _as_index(torch.add(kinds, lanes, out=scratch(_INT32_WORK, tuple(kinds.shape), torch.int32,
                                                         batch.device)), _INDEX)  # [N, T] lane · kinds + kind
    slots = torch.zeros(batch.size, LANES, KINDS, dtype=weights.dtype, device=batch.device)
    slots.view(batch.size, -1).scatter_add_(1, slot, weights)  # [N, LANES, kinds]
    weight = slots.sum(dim=1).double()  # [N, kinds] W_j: Σ_t w per kind (0 on padding)
    rewards = batch.rewards.double()  # [N]
    group_total = group_sum(rewards, layout)  # [G]
    group_weight = group_sum(weight, layout)  # [G, kinds]
    mean_weighted = group_weight * (group_total / layout.sizes.double()).unsqueeze(1)  # [G, kinds] Σ_{j∈h} W_j r̄_h
    others_weight = weight.sum(dim=0) - weight  # [N, kinds] Σ_{j≠i} W_j
    weighted = weight * rewards.unsqueeze(1)  # [N, kinds] W_j r_j
    above = weighted.sum(dim=0) - weighted  # [N, kinds] Σ_{j≠i} W_j r_j
    others_in_group = per_response(layout.sizes, layout).double() - 1  # [N]
    mean_without = (per_response(group_total, layout) - rewards) / others_in_group.clamp(min=1)  # [N] r̄_{g,−i}
    below = (mean_weighted.sum(dim=0) - per_response(mean_weighted, layout)
             + (per_response(group_weight, layout) - weight) * mean_without.unsqueeze(1))  # [N, kinds]
    origin = floor.unsqueeze(1) * others_weight  # [N, kinds] Σ_{j≠i} W_j f_i
    above, below = above - origin, below - origin
    return torch.where(below > 1e-12 * others_weight.clamp(min=1e-300), above / below.clamp(min=1e-300), 1.0)


@lru_cache(maxsize=16)
def _lane_offsets(width: int, device: str) -> torch.Tensor:
    """``[width]`` int32 ``(t mod LANES) · KINDS``: the first slot of token ``t``'s lane
    (``value_ratios``)."""
    return (torch.arange(width, dtype=torch.int32, device=device) % LANES).mul_(KINDS)


def _advantage_table(batch: RolloutBatch, values: torch.Tensor, intervals: PathIntervals, kappa: torch.Tensor,
                     lowest: torch.Tensor, scale: torch.Tensor, past_end: torch.Tensor,
                     params: TreeOTBParams) -> torch.Tensor:
    """``[N, (E+1) · kinds]`` float32 advantage before the own share of every cell
    ``interval · kinds + kind``: the mean over the interval's prefix class of
    ``((r − f) − κ (V̂ − f)) / c`` (``values [N, D+1]`` V̂ on each path segment,
    ``kappa [N, kinds]`` κ and ``lowest [N]`` f of each member, ``scale [N]`` c, the same
    for the whole class), in float64 and then rounded; 0 on the padding and, without the
    own share, for a response alone in its group."""
    layout = batch.groups
    floor = lowest.unsqueeze(1)  # [N, 1]
    columns = torch.cat([batch.rewards.double().unsqueeze(1), values], dim=1).sub_(floor)  # [N, D+2] r − f, V̂ − f
    if params.scale != "none":
        columns.div_(scale.unsqueeze(1))
    above = intervals.class_means(columns[:, :1])  # [N, E+1, 1]
    below = intervals.class_means_times(columns[:, 1:], kappa)  # [N, E+1, kinds] class mean of κ (V̂ − f)
    table = (above - below).float()  # [N, E+1, kinds]
    table.masked_fill_(past_end.unsqueeze(2), 0.0)  # 0 on the padding
    if not params.own_share:  # a response alone has no other to learn from: 0, as with its own share
        table.mul_((per_response(layout.sizes, layout) > 1).view(-1, 1, 1))
    return table.view(batch.size, -1)


def _other_responses_floor(batch: RolloutBatch) -> torch.Tensor:
    """``[N]`` float64 the lowest reward of the call's other responses (0 for a call of
    one response: it has no baseline to shift)."""
    rewards = batch.rewards.double()
    if batch.size < 2:
        return torch.zeros_like(rewards)
    two = rewards.topk(2, largest=False)
    first = torch.arange(batch.size, device=batch.device) == two.indices[0]
    return torch.where(first, two.values[1], two.values[0])


def _own_share(batch: RolloutBatch, running: RunningWeights) -> torch.Tensor:
    """``[N, T]`` float32 ``W_i,t / Σ_j W_j,t`` over the group's responses running at t
    (the float32 ``running`` weights; 0 on padding), written over ``running.cumulative``;
    ``running.total`` is clamped to at least 1e-30 in place."""
    rows, totals = by_group(running.cumulative, running.total.clamp_(min=1e-30), batch.groups)  # W_i, Σ_j W_j
    rows.div_(totals)
    return running.cumulative


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tree_otb", TreeOTB())
