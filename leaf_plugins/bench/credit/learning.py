"""Policy-gradient learning on the tabular policy with each estimator's advantages."""

from __future__ import annotations

import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.credit.exact import expected_reward
from leaf_plugins.bench.credit.measures import group_gradients
from leaf_plugins.bench.credit.sampling import sample_groups

__all__ = ["learning_curve"]


def learning_curve(
    regime: Regime, estimator: str, seed: int, steps: int, groups_per_step: int, learning_rate: float
) -> torch.Tensor:
    """``[steps + 1]`` exact expected reward J before and after each Adam step, where a
    step follows the mean over groups of (1/K) Σ A ∇log π. Adam makes the comparison
    independent of each estimator's advantage scale."""
    env = Environment.build(regime, seed)
    logits = env.logits.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([logits], lr=learning_rate)
    generator = torch.Generator().manual_seed(10_000 + seed)
    curve = [float(expected_reward(env))]
    for _ in range(steps):
        groups = sample_groups(env, groups_per_step, generator)
        advantages, _ = advantages_of(estimator, env, groups)
        ascent = group_gradients(env, groups, advantages).mean(dim=0).reshape(logits.shape)
        optimiser.zero_grad()
        logits.grad = -ascent
        optimiser.step()
        env.logits = logits.detach()
        curve.append(float(expected_reward(env)))
    return torch.tensor(curve)
