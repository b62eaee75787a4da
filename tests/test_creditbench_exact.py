"""The credit benchmark's exact quantities, cross-checked by brute-force enumeration."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.exact import exact_gradient, expected_reward, true_advantages
from leaf_plugins.bench.credit.measures import forkability, group_gradients, interval, student_interval, student_quantile
from leaf_plugins.bench.credit.sampling import sample_groups
from leaf_plugins.core.tree import Node

TINY = Regime(name="tiny", horizon=5, vocab=3, decisions=(1, 3), group_size=4, peak_logit=2.0)
TINY_EOS = [
    Regime(name="graded", horizon=5, vocab=2, decisions=(1,), reference_length=3, reward="graded", group_size=4,
           peak_logit=2.0, stop_logit=0.5, early_stop_logit=-0.5, right_bias=0.7),
    Regime(name="exact", horizon=5, vocab=2, decisions=(0, 2), reference_length=3, reward="exact", group_size=4,
           peak_logit=1.5, stop_logit=0.0, early_stop_logit=-1.0),
    Regime(name="features", horizon=5, vocab=2, decisions=(1,), reference_length=3, reward="graded", group_size=4,
           peak_logit=2.0, features=3, feature_similarity=0.6),
]
REGIMES = [TINY] + TINY_EOS


def all_responses(regime: Regime) -> tuple[torch.Tensor, torch.Tensor]:
    """Every possible response ``[R, H]`` (-1 after the end token) and its length ``[R]``,
    listed by walking the tree of prefixes."""
    found: list[tuple[int, ...]] = []

    def walk(prefix: tuple[int, ...]) -> None:
        if len(prefix) == regime.horizon or (prefix and prefix[-1] == regime.end):
            found.append(prefix)
            return
        for token in range(regime.actions if regime.reference_length else regime.vocab):
            walk(prefix + (token,))

    walk(())
    tokens = torch.tensor([list(p) + [-1] * (regime.horizon - len(p)) for p in found])
    return tokens, torch.tensor([len(p) for p in found])


def log_likelihood(env: Environment, parameters: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[N]`` log π(y) by the chain rule, written out position by position."""
    log_policy = torch.log_softmax(env.logits(parameters), dim=-1)
    total = torch.zeros(tokens.shape[0], dtype=torch.float64)
    previous = torch.full((tokens.shape[0],), env.start)
    for t in range(tokens.shape[1]):
        real = tokens[:, t] >= 0
        step = log_policy[t, previous, tokens[:, t].clamp(min=0)]
        total = total + torch.where(real, step, 0.0)
        previous = torch.where(real, tokens[:, t], 0)
    return total


def test_every_response_is_listed_once():
    for regime in TINY_EOS:
        env = Environment.build(regime, 0)
        tokens, _ = all_responses(regime)
        assert float(log_likelihood(env, env.parameters, tokens).exp().sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_expected_reward_and_gradient_match_enumeration(regime, seed):
    env = Environment.build(regime, seed)
    tokens, lengths = all_responses(regime)
    parameters = env.parameters.clone().requires_grad_(True)
    rewards = _reward_by_hand(env, tokens, lengths)
    enumerated = (log_likelihood(env, parameters, tokens).exp() * rewards).sum()  # scalar, differentiable
    (gradient,) = torch.autograd.grad(enumerated, parameters)
    assert float(expected_reward(env)) == pytest.approx(enumerated.detach().item(), abs=1e-12)
    assert torch.allclose(exact_gradient(env), gradient, atol=1e-12)


def _reward_by_hand(env: Environment, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The reward of the module docstring, one response and one token at a time."""
    regime = env.regime
    rewards = []
    for row, length in zip(tokens.tolist(), lengths.tolist()):
        score, mistakes = 0.0, 0.0
        for t, token in enumerate(row[:length]):
            score += float(env.scores[t, token])
            mistakes += float(env.mistakes[t, token])
        rewards.append(score / env.norm * (env.penalty**mistakes if mistakes else 1.0))
    expected = torch.tensor(rewards, dtype=torch.float64)
    assert torch.allclose(env.reward(tokens, lengths), expected, atol=1e-12)
    if regime.reward == "exact":  # exact match: 1 for the reference's best variants and the end at L, else 0
        assert set(expected.unique().tolist()) == {0.0, 1.0}
    return expected


def test_exact_gradient_matches_finite_differences():
    for regime in (TINY, TINY_EOS[0]):
        env = Environment.build(regime, 5)
        gradient = exact_gradient(env)
        step = 1e-6
        for index in [(0, 2, 1), (1, 1, 0), (3, 0, 2), (4, 1, 1)]:
            shifted = env.parameters.clone()
            shifted[index] += step
            up = float(expected_reward(env, shifted))
            shifted[index] -= 2 * step
            down = float(expected_reward(env, shifted))
            assert gradient[index].item() == pytest.approx((up - down) / (2 * step), abs=1e-8)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
def test_true_advantages_are_q_minus_v_by_enumeration(regime):
    env = Environment.build(regime, 3)
    tokens, lengths = all_responses(regime)
    probability = log_likelihood(env, env.parameters, tokens).exp()
    rewards = env.reward(tokens, lengths)

    def value(prefix: tuple[int, ...]) -> float:
        """E[r | y starts with prefix], by summing over all completions."""
        match = torch.ones(len(tokens), dtype=torch.bool)
        for t, token in enumerate(prefix):
            match &= tokens[:, t] == token
        return float((probability[match] * rewards[match]).sum() / probability[match].sum())

    chosen = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(0))[:12]
    advantages = true_advantages(env, tokens[chosen], lengths[chosen])
    for row, response, length in zip(advantages, tokens[chosen].tolist(), lengths[chosen].tolist()):
        for t in range(regime.horizon):
            expected = value(tuple(response[: t + 1])) - value(tuple(response[:t])) if t < length else 0.0
            assert row[t].item() == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
def test_group_gradient_equals_autograd_of_the_surrogate(regime):
    env = Environment.build(regime, 1)
    groups = sample_groups(env, 3, torch.Generator().manual_seed(1))
    advantages = torch.randn(groups.tokens.shape, generator=torch.Generator().manual_seed(2))
    parameters = env.parameters.clone().requires_grad_(True)
    log_policy = torch.log_softmax(env.logits(parameters), dim=-1)
    positions = torch.arange(regime.horizon).expand_as(groups.tokens)
    per_token = log_policy[positions, groups.previous, groups.tokens.clamp(min=0)]  # [N, H]
    per_token = torch.where(groups.mask, per_token, 0.0)
    expected = []
    for g in range(3):
        rows = slice(g * regime.group_size, (g + 1) * regime.group_size)
        surrogate = (advantages[rows].double() * per_token[rows]).sum() / regime.group_size
        (gradient,) = torch.autograd.grad(surrogate, parameters, retain_graph=True)
        expected.append(gradient.reshape(-1))
    assert torch.allclose(group_gradients(env, groups, advantages), torch.stack(expected), atol=1e-12)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
def test_unbiased_advantages_average_to_the_exact_gradient(regime):
    """With A = Q - V, or with the exact baseline A = r - J, the mean of the K-sample
    gradient estimates converges to ∇J."""
    env = Environment.build(replace(regime, group_size=8), 4)
    groups = sample_groups(env, 3000, torch.Generator().manual_seed(4))
    truth = exact_gradient(env).reshape(-1)
    for advantages in (
        true_advantages(env, groups.tokens, groups.lengths),
        (groups.batch.rewards.double() - expected_reward(env).detach()).unsqueeze(1).expand_as(groups.tokens),
    ):
        mean = group_gradients(env, groups, advantages).mean(dim=0)
        assert float(mean @ truth / (mean.norm() * truth.norm())) > 0.99


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
def test_sampled_log_probabilities_and_sum_pi_squared_are_the_policy_s(regime):
    env = Environment.build(regime, 2)
    groups = sample_groups(env, 4, torch.Generator().manual_seed(0))
    policy = env.policy()
    for i, (row, length) in enumerate(zip(groups.tokens.tolist(), groups.lengths.tolist())):
        previous = env.start
        assert all(token >= 0 for token in row[:length]) and all(token == -1 for token in row[length:])
        if length < regime.horizon:
            assert row[length - 1] == regime.end
        for t, token in enumerate(row[:length]):
            here = policy[t, previous]
            assert groups.batch.logprobs[i, t].item() == pytest.approx(float(here[token].log()), abs=1e-5)
            assert groups.batch.surprisal[i, t].item() == pytest.approx(-float(here[token].log()), abs=1e-5)
            assert groups.batch.sum_pi_squared[i, t].item() == pytest.approx(float(here.square().sum()), abs=1e-6)
            previous = token


def test_decision_positions_carry_the_entropy():
    env = Environment.build(Regime(), 0)
    policy = env.policy()[:, :, : Regime().vocab]
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


def test_student_interval_uses_the_t_quantile_of_its_sample_size():
    result = student_interval(torch.tensor([1.0, 2.0, 3.0, float("nan")]))
    assert result.mean == pytest.approx(2.0)
    assert result.half_width == pytest.approx(4.303 * 1.0 / math.sqrt(3))  # t(0.975, 2 degrees of freedom)
    assert result.count == 3
    single = student_interval(torch.tensor([0.5]))
    assert (single.mean, single.half_width) == (0.5, float("inf"))  # one sample: no interval


@pytest.mark.parametrize("freedom, exact", [(1, 12.706), (9, 2.262), (30, 2.042), (40, 2.021), (60, 2.000),
                                            (120, 1.980)])
def test_student_quantile_matches_the_tables(freedom, exact):
    assert student_quantile(freedom) == pytest.approx(exact, abs=0.001)
