"""The credit benchmark's exact quantities, cross-checked by brute-force enumeration."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.exact import exact_gradient, expected_reward, true_advantages
from leaf_plugins.bench.credit.measures import forkability, group_gradients, interval
from leaf_plugins.bench.credit.sampling import sample_groups
from leaf_plugins.core.tree import Node

TINY = Regime(name="tiny", horizon=5, vocab=3, decisions=(1, 3), group_size=4, peak_logit=2.0)


def all_responses(regime: Regime) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(regime.vocab), repeat=regime.horizon)))  # [V^H, H]


def log_likelihood(env: Environment, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[N]`` log π(y) by the chain rule, written out position by position."""
    log_policy = torch.log_softmax(logits, dim=-1)
    total = torch.zeros(tokens.shape[0], dtype=torch.float64)
    previous = torch.full((tokens.shape[0],), env.start)
    for t in range(tokens.shape[1]):
        total = total + log_policy[t, previous, tokens[:, t]]
        previous = tokens[:, t]
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_reward_and_gradient_match_enumeration(seed):
    env = Environment.build(TINY, seed)
    tokens = all_responses(TINY)
    logits = env.logits.clone().requires_grad_(True)
    enumerated = (log_likelihood(env, logits, tokens).exp() * env.reward(tokens)).sum()  # scalar, differentiable
    (gradient,) = torch.autograd.grad(enumerated, logits)
    assert float(expected_reward(env)) == pytest.approx(enumerated.detach().item(), abs=1e-12)
    assert torch.allclose(exact_gradient(env), gradient, atol=1e-12)


def test_exact_gradient_matches_finite_differences():
    env = Environment.build(TINY, 5)
    gradient = exact_gradient(env)
    step = 1e-6
    for index in [(0, 3, 1), (1, 2, 0), (3, 0, 2), (4, 1, 1)]:
        shifted = env.logits.clone()
        shifted[index] += step
        up = float(expected_reward(env, shifted))
        shifted[index] -= 2 * step
        down = float(expected_reward(env, shifted))
        assert gradient[index].item() == pytest.approx((up - down) / (2 * step), abs=1e-8)


def test_true_advantages_are_q_minus_v_by_enumeration():
    env = Environment.build(TINY, 3)
    tokens = all_responses(TINY)
    probability = log_likelihood(env, env.logits, tokens).exp()
    rewards = env.reward(tokens)

    def value(prefix: tuple[int, ...]) -> float:
        """E[r | y starts with prefix], by summing over all completions."""
        match = torch.ones(len(tokens), dtype=torch.bool)
        for t, token in enumerate(prefix):
            match &= tokens[:, t] == token
        return float((probability[match] * rewards[match]).sum() / probability[match].sum())

    sample = tokens[torch.randperm(len(tokens), generator=torch.Generator().manual_seed(0))[:12]]
    advantages = true_advantages(env, sample)
    for row, response in zip(advantages, sample.tolist()):
        for t in range(TINY.horizon):
            expected = value(tuple(response[: t + 1])) - value(tuple(response[:t]))
            assert row[t].item() == pytest.approx(expected, abs=1e-10)


def test_group_gradient_equals_autograd_of_the_surrogate():
    env = Environment.build(TINY, 1)
    groups = sample_groups(env, 3, torch.Generator().manual_seed(1))
    advantages = torch.randn(groups.tokens.shape, generator=torch.Generator().manual_seed(2))
    logits = env.logits.clone().requires_grad_(True)
    log_policy = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(TINY.horizon).expand_as(groups.tokens)
    per_token = log_policy[positions, groups.previous, groups.tokens]  # [N, H]
    expected = []
    for g in range(3):
        rows = slice(g * TINY.group_size, (g + 1) * TINY.group_size)
        surrogate = (advantages[rows].double() * per_token[rows]).sum() / TINY.group_size
        (gradient,) = torch.autograd.grad(surrogate, logits, retain_graph=True)
        expected.append(gradient.reshape(-1))
    assert torch.allclose(group_gradients(env, groups, advantages), torch.stack(expected), atol=1e-12)


def test_unbiased_advantages_average_to_the_exact_gradient():
    """With A = Q - V, or with the exact baseline A = r - J, the mean of the K-sample
    gradient estimates converges to ∇J."""
    env = Environment.build(replace(TINY, group_size=8), 4)
    groups = sample_groups(env, 3000, torch.Generator().manual_seed(4))
    truth = exact_gradient(env).reshape(-1)
    for advantages in (
        true_advantages(env, groups.tokens),
        (groups.batch.rewards.double() - expected_reward(env).detach()).unsqueeze(1).expand_as(groups.tokens),
    ):
        mean = group_gradients(env, groups, advantages).mean(dim=0)
        assert float(mean @ truth / (mean.norm() * truth.norm())) > 0.99


def test_surprisal_is_the_negative_log_probability_of_the_sampled_token():
    env = Environment.build(TINY, 2)
    groups = sample_groups(env, 2, torch.Generator().manual_seed(0))
    policy = env.policy()
    positions = torch.arange(TINY.horizon).expand_as(groups.tokens)
    expected = -torch.log(policy[positions, groups.previous, groups.tokens])
    assert torch.allclose(groups.batch.surprisal.double(), expected, atol=1e-6)


def test_decision_positions_carry_the_entropy():
    env = Environment.build(Regime(), 0)
    policy = env.policy()
    entropy = -(policy * policy.log()).sum(-1).mean(-1)  # [H]
    decisions = list(Regime().decisions)
    others = [t for t in range(Regime().horizon) if t not in decisions]
    assert entropy[decisions].min() > 5 * entropy[others].max()


def test_forkability_counts_fired_boundaries():
    nodes = [[Node(2, (0, 1, 2), 0.5), Node(6, (0, 1), 0.2)], []]
    rate, size = forkability(nodes, [[2, 6], [3]])
    assert rate == pytest.approx(2 / 3)
    assert size == pytest.approx(2.5)


def test_interval_is_mean_and_normal_half_width():
    result = interval(torch.tensor([1.0, 2.0, 3.0, float("nan")]))
    assert result.mean == pytest.approx(2.0)
    assert result.half_width == pytest.approx(1.96 * 1.0 / math.sqrt(3))
    assert result.count == 3
