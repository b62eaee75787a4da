"""Path-variance machinery of the optimal token baseline (verl's OTB), shared by ``otb``
and ``tree_otb``: the per-token weights ``1 - 2π_t + Σ_v π_v²`` and their running sums
``W_{i,t}``, the weighted baselines and the replaced-reward advantages. Exact semantics:
docs/estimators.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import GroupLayout, RolloutBatch, group_sum
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.estimators.machinery.group_stats import by_group, per_response
from leaf_plugins.estimators.machinery.scratch import scratch

__all__ = ["optimal_token_baselines", "path_weights", "token_weights", "stable_token_weights", "real_tokens",
           "RunningWeights", "running_weights", "replaced_reward_advantages", "EPSILON", "INCONSISTENCY_TOLERANCE"]

EPSILON = 1e-8
"""verl's ``epsilon``, added to the denominator Σ_i W_{i,t} of the baseline."""

INCONSISTENCY_TOLERANCE = 1e-3
"""How far below 0 a token's weight ``1 - 2π + Σπ²`` may fall (float rounding) before
``logprobs`` and ``sum_pi_squared`` are reported as coming from different distributions:
for any distribution ``Σ_v π_v² >= π_a²``, so the exact weight is ``>= (1 - π_a)² >= 0``."""

_HOW_TO_PROVIDE = (
    "RolloutBatch.from_lists(..., logprobs=..., sum_pi_squared=...) (one value per token; "
    "logprobs = log π(a_t | x, y_<t), sum_pi_squared = Σ_v π(v | x, y_<t)² of the same policy distribution); "
    "the trainer's rollout records both"
)


@dataclass(frozen=True)
class RunningWeights:
    """The cumulative path weights of a batch's responses and their sums per group."""

    cumulative: torch.Tensor  # [N, T] W_{i,t} = Σ_{u<=t} w_{i,u}, 0 on padding (a scratch buffer)
    total: torch.Tensor  # [G, T] Σ_j W_{j,t} over the group's responses running at t


@torch.inference_mode()
def running_weights(batch: RolloutBatch, weights: torch.Tensor, real: torch.Tensor,
                    precision: torch.dtype = torch.float32) -> RunningWeights:
    """``W`` and its group sums from the token ``weights [N, T]`` (float32, 0 on padding;
    ``real`` the float mask of ``real_tokens``) in ``precision``; ``cumulative`` lives in
    the scratch buffer ``"otb running"``: valid until the next request for it."""
    cumulative = scratch("otb running", tuple(weights.shape), precision, weights.device)  # [N, T]
    torch.cumsum(weights, dim=1, dtype=precision, out=cumulative).mul_(real)
    return RunningWeights(cumulative, group_sum(cumulative, batch.groups))


@torch.inference_mode()
def replaced_reward_advantages(batch: RolloutBatch, replaced: torch.Tensor, running: RunningWeights,
                               real: torch.Tensor, own_share: bool) -> torch.Tensor:
    """``[N, T]`` float32 OTB's advantage of every token with the response's own reward
    replaced by ``replaced [N, T]`` (float32 per token, 0 on padding: e.g. the mean
    reward of the responses that share its prefix through it), on the ``running``
    weights of ``running_weights`` (from ``stable_token_weights``, which keeps the
    weights of near-deterministic tokens that ``token_weights``' float32
    ``1 − 2π + Σπ²`` gets up to 10% wrong); 0 on padding (``real``: the float mask of
    ``real_tokens``). With ``own_share`` the result is written over ``replaced``;
    ``running`` is left as it was.

    With ``own_share`` (verl's OTB, the response's own return in its baseline) the
    baseline is ``Σ_j W_j r_j / Σ_j W_j`` over the group's responses running at ``t``, 0
    where fewer than two run or they have no weight (verl adds ``ε`` to the denominator,
    which moves the baseline toward 0 where every weight is tiny: without it, shifting
    all rewards shifts the baseline with them). Without, it leaves the response out,
    ``(Σ_j W_j r_j − W_i ρ) / (Σ_j W_j − W_i)`` (``ρ`` the replaced reward; for ``ρ = r_i``
    the W-weighted mean reward of the others), 0 where the others running have no weight
    (among them a response alone): that baseline depends on neither the response's
    tokens from ``t`` on nor its reward. ``running`` should be float32 with the share (at
    most ``T`` positive terms in ``W``, a relative error below ``T · 2⁻²⁴``, as in
    ``optimal_token_baselines``) and float64 without (``Σ_j W_j − W_i`` cancels)."""
    layout = batch.groups
    cumulative, total = running.cumulative, running.total  # [N, T], [G, T]
    weighted_rewards = scratch("otb weighted rewards", tuple(cumulative.shape), cumulative.dtype, cumulative.device)
    torch.mul(cumulative, batch.rewards.to(cumulative.dtype).unsqueeze(1), out=weighted_rewards)  # [N, T] W_j r_j
    weighted = group_sum(weighted_rewards, layout)  # [G, T] Σ_j W_j r_j
    if own_share:
        baseline = torch.where(total > 0, weighted.div_(total.clamp(min=1e-30)), 0.0)  # [G, T]
        positions = torch.arange(batch.width, device=batch.device)
        baseline.masked_fill_(positions >= _second_longest(batch.lengths, layout).unsqueeze(1), 0.0)
        rows, baselines = by_group(replaced, baseline.to(replaced.dtype), layout)
        rows.addcmul_(baselines, real.view(rows.shape), value=-1)  # ρ − b on real tokens, 0 on padding
        return replaced
    others = per_response(total, layout).sub_(cumulative)  # [N, T] Σ_{j≠i} W_j
    leave_out = per_response(weighted, layout).sub_(weighted_rewards.copy_(cumulative).mul_(replaced))
    leave_out.div_(others.clamp(min=1e-300))
    return (replaced - torch.where(others > 0, leave_out, 0.0)).float().mul_(real)


@torch.inference_mode()
def optimal_token_baselines(batch: RolloutBatch) -> torch.Tensor:
    """``[G, T]`` float32 baseline ``b_t`` of every group at every position: the
    ``W``-weighted mean reward of the responses running at t (``Σ_i W r_i / (Σ_i W + ε)``),
    or 0 where fewer than two of the group's responses are running."""
    layout = batch.groups
    rewards = batch.rewards.float()  # [N]
    cumulative = path_weights(batch)  # [N, T]: W_{i,t}, 0 on padding (a scratch buffer)
    denominator = group_sum(cumulative, layout).add_(EPSILON)  # [G, T]: Σ_i W_{i,t} + ε
    numerator = group_sum(cumulative.mul_(rewards.unsqueeze(1)), layout)  # [G, T]: Σ_i W_{i,t} G_{i,t}
    baseline = numerator.div_(denominator)  # [G, T]
    _check_finite(baseline, rewards, batch)
    positions = torch.arange(batch.width, device=batch.device)
    return baseline.masked_fill_(positions >= _second_longest(batch.lengths, layout).unsqueeze(1), 0.0)


@torch.inference_mode()
def path_weights(batch: RolloutBatch) -> torch.Tensor:
    """``[N, T]`` float32 cumulative path weights ``W_{i,t} = Σ_{u<=t} w_{i,u}`` (see
    ``token_weights``), 0 on padding, in the scratch buffer ``"otb work"``: valid until
    the next request for it (use it within one call; copy it to keep it)."""
    real = real_tokens(batch)  # [N, T]
    return token_weights(batch, real).cumsum_(dim=1).mul_(real)


def token_weights(batch: RolloutBatch, real: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, T]`` float32 token weights ``w_{i,u} = max(0, 1 - 2π_{i,u} + Σ_v π_v²)``, the
    squared norm of the softmax score of the sampled token, 0 on padding, in the scratch
    buffer ``"otb work"`` (``real``: the float mask of ``real_tokens``, if at hand), in
    verl's float32 arithmetic (``stable_token_weights`` keeps near-deterministic tokens).

    A ConfigError names a missing ``logprobs`` or ``sum_pi_squared`` field, and a token
    whose ``sum_pi_squared`` is clearly below π² (no distribution allows it). Finite values
    on the fields' padding are never read (a NaN or an infinity there is reported).
    """
    logprobs, sum_pi_squared = _policy_fields(batch)
    real = real_tokens(batch) if real is None else real  # [N, T]
    weight = scratch("otb work", tuple(real.shape), torch.float32, real.device)  # [N, T]
    torch.exp(logprobs, out=weight)  # π
    torch.add(sum_pi_squared, weight, alpha=-2, out=weight)  # Σπ² - 2π
    torch.addcmul(real, weight, real, out=weight)  # (1 - 2π + Σπ²) · real: 0 on padding
    _check_consistent(weight, logprobs, sum_pi_squared)
    # exact weights are >= 0; rounding may leave them a hair below
    return weight.clamp_(min=0)


def stable_token_weights(batch: RolloutBatch, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The token weights of ``token_weights`` written as ``w = 2(1 - π) - (1 - Σπ²)``, so
    that float32 keeps the weights of near-deterministic tokens: ``[N, T]`` float32 ``w``
    and the ``[N, T]`` float32 spread ``1 - Σπ²`` of every state, both 0 on padding
    (``real``: the float mask of ``real_tokens``), in the scratch buffers ``"otb stable"``
    and ``"otb spread"``; the same ConfigErrors.

    Precision: ``1 - Σπ²`` is exact in float32 for ``Σπ² >= 0.5`` (and ``w >= 0.08``
    otherwise); ``1 - π = -expm1(log π)`` keeps its relative precision (an ulp) as π → 1;
    so the only loss is the final difference, at most about ``2(1 - π) · 2⁻²³``
    absolute. Where ``1 - π < 1/8`` that is below what the float32 input already leaves
    open (``Σπ²`` near 1 is known to ±2⁻²⁵, and ``w`` inherits that uncertainty whole);
    elsewhere it is below 2⁻¹⁹ of ``w`` (``w >= (1 - π)²``). (``1 - 2π + Σπ²`` in float32
    errs by up to 2⁻²³ whatever π, 10 % of ``w`` at π = 0.999; in float64 it takes 2.5×
    the time.)
    """
    logprobs, sum_pi_squared = _policy_fields(batch)
    shape = tuple(real.shape)
    spread = scratch("otb spread", shape, torch.float32, real.device)
    torch.addcmul(real, sum_pi_squared, real, value=-1, out=spread)  # [N, T] (1 - Σπ²) · real
    weight = torch.expm1(logprobs, out=scratch("otb stable", shape, torch.float32, real.device))  # π - 1
    torch.addcmul(spread, weight, real, value=2, out=weight).neg_()  # (2(1 - π) - (1 - Σπ²)) · real
    _check_consistent(weight, logprobs, sum_pi_squared)
    return weight.clamp_(min=0), spread


@torch.inference_mode()
def real_tokens(batch: RolloutBatch) -> torch.Tensor:
    """``[N, T]`` float32 mask: 1.0 on real tokens, 0.0 on padding, in the scratch buffer
    ``"otb real"`` (valid until the next request for it)."""
    real = scratch("otb real", tuple(batch.tokens.shape), torch.float32, batch.device)  # [N, T]
    positions = torch.arange(batch.width, dtype=torch.float32, device=batch.device)  # exact below 2^24
    return torch.lt(positions, batch.lengths.float().unsqueeze(1), out=real)  # float compare: 8x faster than int64


def _policy_fields(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ``logprobs`` and ``sum_pi_squared`` ``[N, T]``, or a ConfigError naming
    the missing field and how to provide it."""
    missing = [name for name in ("logprobs", "sum_pi_squared") if getattr(batch, name) is None]
    if missing:
        fields = " and ".join(missing)
        raise ConfigError(
            f"the path-variance weights 1 - 2π + Σπ² (of 'otb' and 'tree_otb') need the batch's per-token "
            f"logprobs and sum_pi_squared, but the batch has no {fields}: "
            f"pass {'them' if len(missing) > 1 else 'it'} as {_HOW_TO_PROVIDE}"
        )
    return batch.logprobs, batch.sum_pi_squared


def _second_longest(lengths: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """``[G]`` int64: the second-largest response length of each group (``-1`` for a
    group of one). At position t at least two of the group's responses are running iff
    ``t <`` this length."""
    members = layout.members  # [G, K_max], -1 padded
    if members.shape[1] < 2:
        return torch.full((layout.count,), -1, dtype=torch.int64, device=lengths.device)
    member_lengths = torch.where(members >= 0, lengths[members.clamp(min=0)], -1)  # [G, K_max]
    return member_lengths.topk(2, dim=1).values[:, 1]


def _check_consistent(weight: torch.Tensor, logprobs: torch.Tensor, sum_pi_squared: torch.Tensor) -> None:
    """Raise a ConfigError naming the first real token whose weight ``1 - 2π + Σπ²``
    (``weight [N, T]``, 0 on padding) is clearly negative, which no single distribution
    can produce."""
    if weight.numel() == 0 or float(weight.amin()) >= -INCONSISTENCY_TOLERANCE:
        return
    negative = weight < -INCONSISTENCY_TOLERANCE  # [N, T]; NaN compares False and is reported later
    if not bool(negative.any()):
        return
    i, t = (int(v) for v in negative.nonzero()[0])
    pi = float(logprobs[i, t].exp())
    raise ConfigError(
        f"path-variance weights: at response {i}, token {t}, "
        f"sum_pi_squared = {float(sum_pi_squared[i, t]):.6g} is below "
        f"π² = {pi * pi:.6g} of the sampled token (π = exp(logprobs) = {pi:.6g}), which no distribution allows "
        f"(Σ_v π_v² >= π_a²): logprobs and sum_pi_squared must come from the same policy distribution "
        f"(the one the loss differentiates, not the top-p/temperature sampling one)"
    )


def _check_finite(baseline: torch.Tensor, rewards: torch.Tensor, batch: RolloutBatch) -> None:
    """Raise a ConfigError naming the field and entry that holds a NaN or an infinity.

    The baseline is a weighted mean of the rewards, so its sum overflows only when an
    input is not finite: one reduction decides, the search runs only on failure.
    """
    if math.isfinite(float(baseline.sum())) and math.isfinite(float(rewards.sum())):
        return
    bad_rewards = ~torch.isfinite(rewards)  # [N]
    if bool(bad_rewards.any()):
        i = int(bad_rewards.nonzero()[0, 0])
        raise ConfigError(f"optimal token baseline: rewards[{i}] = {float(rewards[i])} is not finite")
    mask = batch.mask  # [N, T]
    for where, inside in (("", mask), (" (padding must hold finite values, 0 by convention)", ~mask)):
        for name in ("logprobs", "sum_pi_squared"):
            values = getattr(batch, name)  # [N, T]
            bad = ~torch.isfinite(values) & inside  # [N, T]
            if bool(bad.any()):
                i, t = (int(v) for v in bad.nonzero()[0])
                raise ConfigError(
                    f"path-variance weights: {name}[{i}, {t}] = {float(values[i, t])} is not finite{where}")
    raise ConfigError("optimal token baseline: overflowed (weights or rewards too large for float32)")
