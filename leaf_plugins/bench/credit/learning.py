"""Policy-gradient learning on the task with each estimator's advantages.

Two step rules, so that a step-size effect cannot pass for better credit:

* ``normalised``: the advantages of each step are divided by their root mean square over
  the step's real tokens (every estimator then moves with the same advantage scale),
  then one plain gradient step at a learning rate shared by all estimators;
* ``direction``: a step of fixed length in the direction of the estimated gradient
  (only its direction counts).
"""

from __future__ import annotations

import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.credit.exact import expected_reward
from leaf_plugins.bench.credit.measures import group_gradients
from leaf_plugins.bench.credit.sampling import sample_groups

__all__ = ["learning_curve", "PROTOCOLS"]

PROTOCOLS = ("normalised", "direction")


def learning_curve(
    regime: Regime, estimator: str, seed: int, steps: int, groups_per_step: int, learning_rate: float,
    protocol: str = "normalised",
) -> torch.Tensor:
    """``[steps + 1]`` exact expected reward J before and after each step, where a step
    follows the mean over groups of (1/K) Σ A ∇log π under ``protocol``."""
    env = Environment.build(regime, seed)
    generator = torch.Generator().manual_seed(10_000 + seed)
    curve = [float(expected_reward(env))]
    for _ in range(steps):
        groups = sample_groups(env, groups_per_step, generator)
        advantages, _ = advantages_of(estimator, env, groups)
        advantages = advantages.double()
        if protocol == "normalised":
            advantages = advantages / advantages[groups.mask].square().mean().sqrt().clamp(min=1e-12)
        ascent = group_gradients(env, groups, advantages).mean(dim=0)  # [P]
        if protocol == "direction":
            ascent = ascent / ascent.norm().clamp(min=1e-12)
        env.parameters = env.parameters + learning_rate * ascent.reshape(env.parameters.shape)
        curve.append(float(expected_reward(env)))
    return torch.tensor(curve)
