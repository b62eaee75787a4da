"""Correcting for the gap between the rollout engine's policy and the trainer's.

The rollout samples from π_rollout (its own kernels, bf16, a CUDA-graph decode loop); the
trainer's teacher-forced pass computes π_old for the same weights in other kernels. The
responses are samples of π_rollout, so the loss's expectation over π_old is off by the
importance weight ``π_old / π_rollout`` of each token, or of each response (the product
over its tokens). ``optim.rollout_correction`` (verl's and TRL's names):

* ``none``: no correction (the paper's);
* ``tis``: truncated importance sampling, each token's (or response's) weight
  ``min(π_old / π_rollout, cap)`` multiplies its term of the loss;
* ``mis``: masked importance sampling, a token (or response) whose weight exceeds
  ``cap`` leaves the loss (weight 0), every other keeps weight 1.

With a correction, π_old is the trainer's teacher-forced log π before the step's first
update (whatever ``optim.old_logprobs`` says), since the weight needs both policies.
The weights carry no gradient.

Every step also logs how far the two policies are apart wherever both are computed
(the first update's pass is teacher-forced at θ_old): ``rollout_logprob_gap``, the mean
``|log π_old − log π_rollout|`` per response token, and ``rollout_kl``, the k3 estimate of
KL(π_rollout ‖ π_old) from the sampled tokens (``exp(d) − d − 1``,
``d = log π_old − log π_rollout``).
"""

from __future__ import annotations

import torch

__all__ = ["ROLLOUT_CORRECTIONS", "CORRECTION_LEVELS", "correction_weights", "mismatch_sums"]

ROLLOUT_CORRECTIONS = ("none", "tis", "mis")
CORRECTION_LEVELS = ("token", "sequence")


def correction_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                       method: str, level: str, cap: float) -> torch.Tensor | None:
    """``[N, T]`` the ``method``'s weight of each response token (None for ``none``).

    :param old_logprobs: ``[N, T]`` the trainer's log π_old of the sampled tokens.
    :param rollout_logprobs: ``[N, T]`` the rollout's log π of them.
    :param mask: ``[N, T]`` bool, the response tokens.
    :param level: ``token`` (each token its own ratio) or ``sequence`` (each response the
        product of its tokens' ratios, on every one of its tokens).
    """
    if method == "none":
        return None
    real = mask.to(old_logprobs.dtype)
    log_weight = (old_logprobs.detach() - rollout_logprobs) * real  # [N, T]
    if level == "sequence":
        log_weight = log_weight.sum(dim=1, keepdim=True).expand_as(log_weight)  # [N, T] the response's, on each token
    bound = torch.log(torch.tensor(cap, dtype=log_weight.dtype, device=log_weight.device))
    if method == "tis":
        return torch.exp(torch.minimum(log_weight, bound)) * real
    if method == "mis":
        return (log_weight <= bound).to(real.dtype) * real
    raise ValueError(f"rollout_correction must be one of {', '.join(ROLLOUT_CORRECTIONS)}, got {method!r}")


def mismatch_sums(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[2]`` float64: the sums over the response tokens of ``|log π_old − log π_rollout|``
    and of the k3 estimate of KL(π_rollout ‖ π_old); divided by the token count they give
    the step's ``rollout_logprob_gap`` and ``rollout_kl``."""
    real = mask.to(torch.float64)
    d = (old_logprobs.detach() - rollout_logprobs).to(torch.float64) * real  # [N, T]
    return torch.stack([(d.abs() * real).sum(), ((torch.exp(d) - d - 1) * real).sum()])
