"""Per-token path-variance weights: the squared norm of a softmax score.

For a softmax policy, ∇ log π(a | s) with respect to the logits is ``onehot(a) − π``,
whose squared norm is ``w = 1 − 2 π(a | s) + Σ_v π(v | s)²``: about 2 for a rare token,
about ``(1 − π)²`` for a likely one. The baseline that minimises the variance of the
policy gradient at a state weighs each action's return by it (verl's optimal token
baseline approximates this per group with the cumulative sum ``W_t = Σ_{u<=t} w_u``).
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.errors import ConfigError

__all__ = ["score_norms", "require_policy_fields"]


def require_policy_fields(batch: RolloutBatch, estimator: str) -> None:
    """Raise a ``ConfigError`` naming the field when ``logprobs`` or ``sum_pi_squared``
    is missing."""
    for name, what in (("logprobs", "log π_old of the sampled token"),
                       ("sum_pi_squared", "Σ_v π_old(v)² of the policy distribution")):
        if getattr(batch, name) is None:
            raise ConfigError(
                f"estimator {estimator!r} weighs tokens by their score norm and needs the batch field {name!r} "
                f"({what}, one value per token): pass {name}= to RolloutBatch or RolloutBatch.from_lists "
                "(the trainer records both)"
            )


def score_norms(batch: RolloutBatch, estimator: str) -> torch.Tensor:
    """``[N, T]`` float64 ``w = max(0, 1 − 2π + Σπ²)`` of every token, 0 on padding (the
    exact value is ``>= (1 − π)² >= 0``; rounding may leave it a hair below 0, as ``otb``
    clamps it too)."""
    require_policy_fields(batch, estimator)
    assert batch.logprobs is not None and batch.sum_pi_squared is not None
    weight = 1 - 2 * batch.logprobs.double().exp() + batch.sum_pi_squared.double()  # [N, T]
    return torch.where(batch.mask, weight.clamp(min=0), 0.0)
