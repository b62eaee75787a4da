"""The clipped, KL-regularised token loss of the LEAF paper, Eq. (1)."""

from __future__ import annotations

import torch

from leaf_plugins.core.stages import PolicyLoss

__all__ = ["PolicyLoss", "policy_loss", "OLD_LOGPROB_SOURCES"]

OLD_LOGPROB_SOURCES = ("rollout", "teacher_forced")
"""Where π_old of the ratio comes from (``optim.old_logprobs``): the rollout's own log π
(the sampler's numbers), or the teacher-forced pass of the update itself, detached (with
one optimizer step per rollout, the policy that sampled; the ratio is then exactly 1, so
the rollout/train rounding mismatch never reaches the clip)."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_epsilon: float = 0.2,
    kl_coefficient: float = 0.02,
    weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """``-E[min(ρA, clip(ρ, 1-ε, 1+ε)A)] + β E[exp(d) - d - 1]`` over response tokens.

    :param logprobs: ``[N, T]`` log π_θ of the sampled tokens (differentiable).
    :param old_logprobs: ``[N, T]`` log π_old (the rollout policy), no gradient.
    :param reference_logprobs: ``[N, T]`` log π_ref, no gradient; ``d = log π_ref - log π_θ``
        and ``exp(d) - d - 1`` is the k3 estimator of KL(π_θ || π_ref).
    :param advantages: ``[N, T]`` token advantages.
    :param mask: ``[N, T]`` bool, True on response tokens. Without ``weights`` the
        expectation is the mean over all response tokens of these rows (every token
        weighs the same).
    :param weights: ``[N, T]`` weight of each token in the expectation (0 on padding), when
        these rows are a part of a larger step: ``aggregation.token_weights`` gives the
        step-wide normalisers, so the parts' losses add up to the step's loss.
    """
    mask = mask.to(logprobs.dtype)
    weights = mask / mask.sum().clamp(min=1) if weights is None else weights.to(logprobs.dtype) * mask
    ratio = torch.exp(logprobs - old_logprobs.detach())  # [N, T]
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * advantages
    surrogate = torch.minimum(unclipped, clipped)  # [N, T]
    log_ratio_to_reference = reference_logprobs.detach() - logprobs  # d
    k3 = torch.exp(log_ratio_to_reference) - log_ratio_to_reference - 1  # [N, T], >= 0
    policy_term = -(surrogate * weights).sum()
    kl = (k3 * weights).sum()
    clip_fraction = ((clipped < unclipped).to(mask.dtype) * weights).sum()
    return PolicyLoss(policy_term + kl_coefficient * kl, policy_term.detach(), kl.detach(), clip_fraction.detach())
