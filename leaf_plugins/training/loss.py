"""The token loss of a step: the clipped surrogate of the LEAF paper's Eq. (1), with the
variants current GRPO practice trains with.

``-E[w · min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A)] + β E[KL] - c_H E[H]`` over response
tokens, where

* ``ρ`` is the token's ratio π_θ/π_old (``importance_sampling_level: token``, the paper's),
  or, GSPO's, the sequence's length-normalised ratio
  ``exp(mean_t log(π_θ/π_old))``, which every token of the response takes as its value
  while its gradient is its own token's (``sequence``);
* ``ε_high`` is DAPO's clip-higher (``clip_epsilon_high``; unset: ``ε_low``);
* with ``dual_clip`` c, the term of a token with a negative advantage is bounded below by
  ``c·A`` (dual-clip PPO);
* ``w`` is the rollout correction's weight of the token (1 without one:
  ``importance_correction.py``);
* ``KL`` is the ``kl_estimator`` of KL(π_θ ‖ π_ref) with ``d = log π_ref − log π_θ``:
  ``k1 = −d``, ``k2 = d²/2``, ``k3 = exp(d) − d − 1`` (the paper's), in the loss
  (``kl_in: loss``) or, subtracted from the rewards before the estimator
  (``kl_in: reward``), not here;
* ``H`` is the policy's entropy at the token (``entropy_coefficient`` c_H, 0: none).

The expectation weights each token by its ``weights`` (``aggregation.token_weights``:
the step's normalisers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.stages import PolicyLoss

__all__ = ["policy_loss", "kl_estimate", "LossSettings", "OLD_LOGPROB_SOURCES", "KL_ESTIMATORS", "KL_PLACES",
           "IMPORTANCE_SAMPLING_LEVELS", "LOG_RATIO_LIMIT"]

OLD_LOGPROB_SOURCES = ("rollout", "teacher_forced")
"""Where π_old of the ratio comes from (``optim.old_logprobs``): the rollout's own log π
(the sampler's numbers), or the teacher-forced pass of the update itself, detached (with
one optimizer step per rollout, the policy that sampled; the ratio is then exactly 1, so
the rollout/train rounding mismatch never reaches the clip)."""

KL_ESTIMATORS = ("k1", "k2", "k3")
"""``optim.kl_estimator``: the estimator of KL(π_θ ‖ π_ref) from a sampled token."""

KL_PLACES = ("loss", "reward")
"""``optim.kl_in``: the KL term in the loss (the paper's), or subtracted from each
response's reward before the estimator (summed over its tokens)."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""``optim.importance_sampling_level``: a ratio per token (the paper's, PPO's) or per
response (GSPO's length-normalised sequence ratio)."""

LOG_RATIO_LIMIT = 10.0
"""The sequence-level log ratio is clamped above here (as verl clamps GSPO's), so a
response far off π_old cannot overflow its ratio; the clip acts long before."""


@dataclass(frozen=True)
class LossSettings:
    """The run's choices of the token loss (``optim.*`` of the run config)."""

    clip_epsilon: float = 0.2
    clip_epsilon_high: float | None = None
    dual_clip: float | None = None
    importance_sampling_level: str = "token"
    kl_coefficient: float = 0.02
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    entropy_coefficient: float = 0.0

    @classmethod
    def of(cls, optim: object) -> "LossSettings":
        """The settings of an ``OptimConfig``."""
        return cls(**{name: getattr(optim, name) for name in cls.__dataclass_fields__})

    @property
    def needs_reference(self) -> bool:
        """Whether a KL term is anywhere (loss or reward): a reference pass runs only then."""
        return self.kl_coefficient != 0.0

    @property
    def kl_in_loss(self) -> bool:
        """Whether the loss has a KL term (a reference pass is needed for it)."""
        return self.kl_in == "loss" and self.kl_coefficient != 0.0

    @property
    def kl_in_reward(self) -> bool:
        """Whether each response's reward loses β times its KL before the estimator."""
        return self.kl_in == "reward" and self.kl_coefficient != 0.0


def kl_estimate(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """``[N, T]`` the ``estimator`` of KL(π ‖ π_ref) at each sampled token, from its log π
    and log π_ref (``d = log π_ref − log π``): k1 ``−d``, k2 ``d²/2``, k3 ``exp(d) − d − 1``."""
    d = reference_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings = LossSettings(),
    weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    correction: torch.Tensor | None = None,
) -> PolicyLoss:
    """The loss of some of the step's response tokens (the module's formula).

    :param logprobs: ``[N, T]`` log π_θ of the sampled tokens (differentiable).
    :param old_logprobs: ``[N, T]`` log π_old, no gradient.
    :param reference_logprobs: ``[N, T]`` log π_ref, no gradient; None where no reference
        pass ran (no KL term in the loss: ``kl`` is then 0).
    :param advantages: ``[N, T]`` token advantages.
    :param mask: ``[N, T]`` bool, True on response tokens. Without ``weights`` the
        expectation is the mean over all response tokens of these rows.
    :param weights: ``[N, T]`` weight of each token in the expectation (0 on padding), when
        these rows are a part of a larger step (``aggregation.token_weights``).
    :param entropy: ``[N, T]`` the policy's entropy at each token (differentiable where
        ``settings.entropy_coefficient`` is not 0); None: not computed.
    :param correction: ``[N, T]`` the rollout correction's weight of each token, no
        gradient; None: 1.
    """
    real = mask.to(logprobs.dtype)
    weights = real / real.sum().clamp(min=1) if weights is None else weights.to(logprobs.dtype) * real
    log_ratio = logprobs - old_logprobs.detach()  # [N, T]
    if settings.importance_sampling_level == "sequence":  # GSPO: the response's mean log ratio, per-token gradients
        mean = (log_ratio * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)  # [N]
        log_ratio = (logprobs - logprobs.detach() + mean.detach().unsqueeze(1)).clamp(max=LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)  # [N, T]
    low, high = settings.clip_epsilon, settings.clip_epsilon if settings.clip_epsilon_high is None \
        else settings.clip_epsilon_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - low, 1 + high) * advantages
    surrogate = torch.minimum(unclipped, clipped)  # [N, T]
    if settings.dual_clip is not None:
        surrogate = torch.where(advantages < 0, torch.maximum(surrogate, settings.dual_clip * advantages), surrogate)
    if correction is not None:
        surrogate = surrogate * correction.detach()
    policy_term = -(surrogate * weights).sum()
    loss = policy_term
    if reference_logprobs is not None:
        kl = (kl_estimate(logprobs, reference_logprobs.detach(), settings.kl_estimator) * weights).sum()
        if settings.kl_in == "loss":
            loss = loss + settings.kl_coefficient * kl
    else:
        kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    mean_entropy = (entropy * weights).sum() if entropy is not None else None
    if mean_entropy is not None and settings.entropy_coefficient:
        loss = loss - settings.entropy_coefficient * mean_entropy
    clipped_low = ((ratio < 1 - low) & (advantages < 0)).to(weights.dtype)  # the clip took the lower bound
    clipped_high = ((ratio > 1 + high) & (advantages > 0)).to(weights.dtype)
    return PolicyLoss(loss, policy_term.detach(), kl.detach(), ((clipped_low + clipped_high) * weights).sum().detach(),
                      clip_fraction_low=(clipped_low * weights).sum().detach(),
                      clip_fraction_high=(clipped_high * weights).sum().detach(),
                      entropy=None if mean_entropy is None else mean_entropy.detach())
