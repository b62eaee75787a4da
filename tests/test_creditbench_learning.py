"""The credit benchmark's learning protocols (``bench/credit/learning.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.credit.exact import expected_reward
from leaf_plugins.bench.credit.learning import AdamState, learning_curve
from leaf_plugins.bench.credit.measures import group_gradients
from leaf_plugins.bench.credit.sampling import sample_groups

SMALL = Regime(name="small", horizon=4, vocab=3, decisions=(1, 2), group_size=4, batch_groups=2)


def test_adam_steps_by_hand():
    """Two steps of Adam on the gradients 1 and −3 (one parameter), worked out by hand:
    m₁ = 0.1, v₁ = 0.001 → step 1 = 0.1/0.1 ÷ √(0.001/0.001) = 1 (the sign);
    m₂ = 0.09 − 0.3 = −0.21, v₂ = 0.000999 + 0.009 = 0.009999 → step 2 =
    (−0.21 / 0.19) ÷ √(0.009999 / 0.001999)."""
    adam = AdamState(1)
    assert adam.direction(torch.tensor([1.0], dtype=torch.float64)).item() == pytest.approx(1.0, abs=1e-7)
    second = adam.direction(torch.tensor([-3.0], dtype=torch.float64)).item()
    assert second == pytest.approx((-0.21 / 0.19) / math.sqrt(0.009999 / 0.001999), rel=1e-6)


def test_adams_first_step_moves_every_parameter_by_the_learning_rate_along_its_gradient_sign():
    """Adam's first step is g / (|g| + ε) per parameter: the sign of the estimated gradient
    (less only where |g| is near ε = 1e-8)."""
    seed, groups_per_step, rate = 3, 4, 0.05
    curve = learning_curve(SMALL, "grpo", seed, 1, groups_per_step, rate, "adam")
    env = Environment.build(SMALL, seed)
    start = float(expected_reward(env))
    groups = sample_groups(env, groups_per_step, torch.Generator().manual_seed(10_000 + seed))  # the curve's first draw
    advantages, _ = advantages_of("grpo", env, groups)
    gradient = group_gradients(env, groups, advantages.double()).mean(dim=0)  # [P]
    env.parameters = env.parameters + rate * (gradient / (gradient.abs() + 1e-8)).reshape(env.parameters.shape)
    assert curve[0].item() == pytest.approx(start)
    assert curve[1].item() == pytest.approx(float(expected_reward(env)), abs=1e-6)


def test_paired_learning_gain_differences_seed_by_seed():
    """Seed s of each estimator is paired: the interval is over the per-seed differences,
    not the difference of two unpaired means (their spread across seeds cancels)."""
    from leaf_plugins.bench.credit.measures import Interval
    from leaf_plugins.bench.credit.sweep import Row, paired_learning_gain

    def row(estimator, finals):
        finals = torch.tensor(finals, dtype=torch.float64)
        nothing = Interval(0.0, 0.0, 0)
        return Row(regime="r", estimator=estimator, cosine=nothing, group_cosines=torch.zeros(1), nmse=0.0, bias=None,
                   token_correlation=nothing, final_rewards={"direction": finals}, start_reward=0.0, fire_rate=0.0, fired_group_size=0.0,
                   curves={})

    grpo, better = row("grpo", [0.2, 0.5, 0.8]), row("tree_otb", [0.21, 0.52, 0.83])
    gain = paired_learning_gain([grpo, better], better, "direction")
    assert gain.mean == pytest.approx(0.02)
    assert gain.half_width == pytest.approx(4.303 * 0.01 / math.sqrt(3))  # differences 0.01, 0.02, 0.03: std 0.01
    assert paired_learning_gain([grpo, better], grpo, "direction") is None
    assert paired_learning_gain([better], better, "direction") is None
