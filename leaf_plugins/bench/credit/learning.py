"""Policy-gradient learning on the task with each estimator's advantages.

Two step rules, so that a step-size effect cannot pass for better credit:

* ``normalised``: the advantages of each step are divided by their root mean square over
  the step's real tokens (every estimator then moves with the same advantage scale),
  then one plain gradient step at a learning rate shared by all estimators;
* ``direction``: a step of fixed length in the direction of the estimated gradient
  (only its direction counts);

and the step rule of the trainer itself:

* ``adam``: Adam (β = 0.9, 0.999, ε = 1e-8) on the raw advantages at a learning rate
  shared by all estimators. Each parameter's step is its gradient's running mean over
  the running root mean square, so the advantages' overall scale does not count and a
  parameter whose gradient is mostly noise moves little.
"""

from __future__ import annotations

import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.estimator_choice import EstimatorChoice
from leaf_plugins.bench.credit.exact import expected_reward
from leaf_plugins.bench.credit.measures import group_gradients
from leaf_plugins.bench.credit.sampling import sample_groups

__all__ = ["learning_curve", "AdamState", "PROTOCOLS"]

PROTOCOLS = ("normalised", "direction", "adam")

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


def learning_curve(
    regime: Regime, estimator: str | EstimatorChoice, seed: int, steps: int, groups_per_step: int, learning_rate: float,
    protocol: str = "normalised",
) -> torch.Tensor:
    """``[steps + 1]`` exact expected reward J before and after each step, where a step
    follows the mean over groups of (1/K) Σ A ∇log π under ``protocol``."""
    env = Environment.build(regime, seed)
    generator = torch.Generator().manual_seed(10_000 + seed)
    curve = [float(expected_reward(env))]
    adam = AdamState(env.parameters.numel()) if protocol == "adam" else None
    for _ in range(steps):
        groups = sample_groups(env, groups_per_step, generator)
        advantages, _ = advantages_of(estimator, env, groups)
        advantages = advantages.double()
        if protocol == "normalised":
            advantages = advantages / advantages[groups.mask].square().mean().sqrt().clamp(min=1e-12)
        ascent = group_gradients(env, groups, advantages).mean(dim=0)  # [P]
        if protocol == "direction":
            ascent = ascent / ascent.norm().clamp(min=1e-12)
        if adam is not None:
            ascent = adam.direction(ascent)
        env.parameters = env.parameters + learning_rate * ascent.reshape(env.parameters.shape)
        curve.append(float(expected_reward(env)))
    return torch.tensor(curve)


class AdamState:
    """Adam's running moments of an ascent direction ``[P]`` (bias-corrected)."""

    def __init__(self, size: int) -> None:
        self.mean = torch.zeros(size, dtype=torch.float64)
        self.square = torch.zeros(size, dtype=torch.float64)
        self.steps = 0

    def direction(self, gradient: torch.Tensor) -> torch.Tensor:
        """``[P]`` the step per unit learning rate after this ``gradient [P]``."""
        first, second = ADAM_BETAS
        self.steps += 1
        self.mean.mul_(first).add_(gradient, alpha=1 - first)
        self.square.mul_(second).addcmul_(gradient, gradient, value=1 - second)
        mean = self.mean / (1 - first**self.steps)
        square = self.square / (1 - second**self.steps)
        return mean / (square.sqrt() + ADAM_EPS)
