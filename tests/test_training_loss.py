"""The clipped, KL-regularised token loss (paper Eq. 1) and its variants (clip-higher,
dual clip, GSPO's sequence ratio, k1/k2/k3, entropy bonus, rollout corrections, overlong
responses) on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from leaf_plugins.training.importance_correction import correction_weights, mismatch_sums
from leaf_plugins.training.loss import LossSettings, kl_estimate, policy_loss
from leaf_plugins.training.overlong import overlong_buffer, overlong_penalty, truncated


def example():
    """Two responses (the second two tokens long) whose ratios π/π_old are 1, 1.5, 0.5 and 2, 1."""
    logprobs = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.9]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.1, 0.9]]))
    reference = torch.log(torch.tensor([[0.4, 0.3, 0.2], [0.6, 0.2, 0.9]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0], [2.0, -0.5, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return logprobs, old, reference, advantages, mask


def test_loss_by_hand():
    logprobs, old, reference, advantages, mask = example()
    result = policy_loss(logprobs, old, reference, advantages, mask, LossSettings(clip_epsilon=0.2, kl_coefficient=0.1))
    # ratios 1.0, 1.5 (clipped to 1.2, A > 0), 0.5 (A < 0: min(-0.5, -0.8) = -0.8), 2.0 (clipped 1.2), 1.0
    surrogate = [1.0, 1.2, -0.8, 2.4, -0.5]
    d = [math.log(0.4 / 0.5), 0.0, 0.0, 0.0, math.log(0.2 / 0.1)]
    k3 = [math.exp(x) - x - 1 for x in d]
    expected_policy = -sum(surrogate) / 5
    expected_kl = sum(k3) / 5
    assert result.policy_term.item() == pytest.approx(expected_policy, abs=1e-6)
    assert result.kl.item() == pytest.approx(expected_kl, abs=1e-6)
    assert result.loss.item() == pytest.approx(expected_policy + 0.1 * expected_kl, abs=1e-6)
    assert result.clip_fraction.item() == pytest.approx(3 / 5)
    assert result.clip_fraction_low.item() == pytest.approx(1 / 5)  # 0.5 < 0.8 with A < 0
    assert result.clip_fraction_high.item() == pytest.approx(2 / 5)  # 1.5 and 2.0 > 1.2 with A > 0
    result.loss.backward()
    assert logprobs.grad[1, 2] == 0  # padding gets no gradient


def test_on_policy_zero_advantage_leaves_only_the_kl_term():
    logprobs = torch.log(torch.tensor([[0.2, 0.7]]))
    reference = torch.log(torch.tensor([[0.3, 0.7]]))
    result = policy_loss(logprobs, logprobs, reference, torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    d = math.log(0.3 / 0.2)
    assert result.loss.item() == pytest.approx(0.02 * (math.exp(d) - d - 1) / 2, abs=1e-7)


def test_gradient_raises_the_probability_of_positively_credited_tokens():
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    tokens = torch.tensor([[1, 3]])
    logprobs = torch.log_softmax(logits, -1).gather(2, tokens.unsqueeze(2)).squeeze(2)
    result = policy_loss(logprobs, logprobs.detach(), logprobs.detach(), torch.tensor([[1.0, -1.0]]),
                         torch.ones(1, 2, dtype=torch.bool), LossSettings())
    result.loss.backward()
    # by hand: uniform π = 1/4, ratio 1 (no clipping), KL gradient 0 at π = π_ref; the token
    # mean gives d loss / d log π_t = -A_t / 2 and d log π_t / d logit_v = [v = a_t] - 1/4
    expected = torch.tensor([[[0.125, -0.375, 0.125, 0.125], [-0.125, -0.125, -0.125, 0.375]]])
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-7)  # float32 of eighths: exact up to rounding


def test_clip_higher_widens_only_the_upper_bound():
    logprobs, old, reference, advantages, mask = example()
    result = policy_loss(logprobs, old, None, advantages, mask, LossSettings(clip_epsilon=0.2, clip_epsilon_high=0.6))
    # 1.5 now inside [0.8, 1.6]; 2.0 clipped at 1.6 (A = 2: 3.2); 0.5 still clipped below (A = -1: -0.8)
    assert result.policy_term.item() == pytest.approx(-(1.0 + 1.5 - 0.8 + 3.2 - 0.5) / 5, abs=1e-6)
    assert (result.clip_fraction_low.item(), result.clip_fraction_high.item()) == pytest.approx((1 / 5, 1 / 5))
    assert result.kl.item() == 0  # no reference pass: no KL term


def test_dual_clip_bounds_a_negative_advantage_term_and_stops_its_gradient():
    logprobs = torch.log(torch.tensor([[0.5, 0.4]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.1, 0.2]]))  # ratios 5 and 2
    advantages = torch.tensor([[-1.0, -1.0]])
    result = policy_loss(logprobs, old, None, advantages, torch.ones(1, 2, dtype=torch.bool),
                         LossSettings(dual_clip=3.0))
    # min(ρA, clip(ρ)A) = -5 and -2; the dual clip bounds them below by 3A = -3: -3 and -2
    assert result.loss.item() == pytest.approx((3 + 2) / 2, abs=1e-6)
    result.loss.backward()
    # the bounded term is a constant; the other is -ρA/2 with d/d log π = -ρA/2 = 1
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 1.0]]), rtol=0, atol=1e-6)


def test_sequence_ratio_is_gspo_s_length_normalised_ratio_with_each_token_s_gradient():
    logprobs, old, reference, advantages, mask = example()
    result = policy_loss(logprobs, old, None, advantages, mask, LossSettings(importance_sampling_level="sequence"))
    first, second = 0.75 ** (1 / 3), 2 ** 0.5  # exp of the mean log ratio: (1·1.5·0.5)^⅓ and (2·1)^½
    # first response inside the clip: its ratio times A; second: A = 2 clipped at 1.2, A = -0.5 not
    terms = [first, first, -first, 2.4, -0.5 * second]
    assert result.policy_term.item() == pytest.approx(-sum(terms) / 5, abs=1e-6)
    result.loss.backward()
    # d term / d log π_t = (the response's ratio)·A_t where not clipped, 0 where clipped
    expected = torch.tensor([[-first, -first, first], [0.0, 0.5 * second, 0.0]]) / 5
    torch.testing.assert_close(logprobs.grad, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_by_hand(estimator):
    logprobs, reference = torch.log(torch.tensor([0.5, 0.2])), torch.log(torch.tensor([0.25, 0.4]))
    d = [math.log(0.5), math.log(2.0)]  # log π_ref - log π
    expected = {"k1": [-x for x in d], "k2": [x * x / 2 for x in d], "k3": [math.exp(x) - x - 1 for x in d]}
    torch.testing.assert_close(kl_estimate(logprobs, reference, estimator), torch.tensor(expected[estimator]),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_unbiased_estimators_average_to_the_exact_kl_over_the_policy(estimator):
    policy, reference = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.2, 0.2, 0.6],
                                                                                         dtype=torch.float64)
    exact = (policy * (policy / reference).log()).sum()
    average = (policy * kl_estimate(policy.log(), reference.log(), estimator)).sum()  # E over x ~ π, every x
    assert average.item() == pytest.approx(exact.item(), rel=1e-12)


def test_kl_in_reward_leaves_the_loss_without_a_kl_term_and_reports_it():
    logprobs, old, reference, advantages, mask = example()
    in_loss = policy_loss(logprobs, old, reference, advantages, mask, LossSettings(kl_coefficient=0.1))
    in_reward = policy_loss(logprobs, old, reference, advantages, mask, LossSettings(kl_coefficient=0.1,
                                                                                     kl_in="reward"))
    assert in_reward.kl.item() == pytest.approx(in_loss.kl.item())
    assert in_reward.loss.item() == pytest.approx(in_reward.policy_term.item())
    assert not LossSettings(kl_in="reward").kl_in_loss and not LossSettings(kl_coefficient=0.0).kl_in_loss


def test_entropy_bonus_subtracts_the_mean_entropy():
    logprobs, old, reference, advantages, mask = example()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]], requires_grad=True)  # 99: padding, not counted
    result = policy_loss(logprobs, old, None, advantages, mask, LossSettings(entropy_coefficient=0.1), entropy=entropy)
    assert result.entropy.item() == pytest.approx(3.0)
    assert result.loss.item() == pytest.approx(result.policy_term.item() - 0.1 * 3.0, abs=1e-6)
    result.loss.backward()
    torch.testing.assert_close(entropy.grad, -0.1 * mask.float() / 5, rtol=0, atol=1e-7)


def test_a_correction_weight_multiplies_its_token_s_term():
    logprobs, old, reference, advantages, mask = example()
    correction = torch.tensor([[1.0, 0.5, 1.0], [0.0, 1.0, 1.0]])
    result = policy_loss(logprobs, old, None, advantages, mask, LossSettings(), correction=correction)
    assert result.policy_term.item() == pytest.approx(-(1.0 + 0.5 * 1.2 - 0.8 + 0.0 - 0.5) / 5, abs=1e-6)


def test_truncated_and_masked_importance_weights_by_hand():
    old, rollout = torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.4]]))  # ratios 2, ½
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert correction_weights(old, rollout, mask, "none", "token", 1.5) is None
    torch.testing.assert_close(correction_weights(old, rollout, mask, "tis", "token", 1.5), torch.tensor([[1.5, 0.5]]))
    torch.testing.assert_close(correction_weights(old, rollout, mask, "mis", "token", 1.5), torch.tensor([[0.0, 1.0]]))
    # the response's weight is the product 2 · ½ = 1, on both tokens
    torch.testing.assert_close(correction_weights(old, rollout, mask, "tis", "sequence", 1.5), torch.ones(1, 2))
    torch.testing.assert_close(correction_weights(old, rollout, mask, "tis", "sequence", 0.9),
                               torch.full((1, 2), 0.9))
    torch.testing.assert_close(correction_weights(old, rollout, mask, "mis", "sequence", 0.9), torch.zeros(1, 2))
    gap, kl = mismatch_sums(old, rollout, mask).tolist()
    assert gap == pytest.approx(2 * math.log(2))  # |log 2| + |log ½|
    assert kl == pytest.approx((2 - math.log(2) - 1) + (0.5 + math.log(2) - 1))  # k3 at d = log 2 and log ½


def test_overlong_responses_and_dapo_s_soft_penalty_by_hand():
    eos = 2
    tokens = torch.tensor([[5, 6, 2, -1, -1], [5, 6, 7, 8, 9], [5, 6, 7, 8, 2]])
    lengths = torch.tensor([3, 5, 5])
    assert truncated(tokens, lengths, 5, eos).tolist() == [False, True, False]  # the third ended with EOS at 5
    assert overlong_buffer(10, None) == 2 and overlong_buffer(10, 0) == 1 and overlong_buffer(10, 50) == 10
    # L = 5, B = 2: no penalty up to 3 tokens, then -1/2 per token down to -1 at 5
    assert overlong_penalty(torch.tensor([2, 3, 4, 5]), 5, 2, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0]


def test_every_choice_at_once_by_hand():
    """Dual clip 3, clip-higher 0.28, TIS at cap 1.5, k1 in the loss at β = 0.1, entropy 0.01."""
    logprobs = torch.log(torch.tensor([[0.5, 0.4, 0.3]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.1, 0.2, 0.3]]))  # ratios 5, 2, 1
    rollout = torch.log(torch.tensor([[0.05, 0.25, 0.3]]))  # π_old/π_rollout 2, 0.8, 1: TIS weights 1.5, 0.8, 1
    reference = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))  # k1 = log π - log π_ref: log 2, 0, 0
    advantages, mask = torch.tensor([[-1.0, 1.0, 2.0]]), torch.ones(1, 3, dtype=torch.bool)
    settings = LossSettings(clip_epsilon=0.2, clip_epsilon_high=0.28, dual_clip=3.0, kl_coefficient=0.1,
                            kl_estimator="k1", entropy_coefficient=0.01)
    correction = correction_weights(old, rollout, mask, "tis", "token", 1.5)
    result = policy_loss(logprobs, old, reference, advantages, mask, settings,
                         entropy=torch.tensor([[1.0, 2.0, 3.0]]), correction=correction)
    # token 1: min(-5, -1.28) = -5, dual-clipped to -3, times 1.5; token 2: min(2, 1.28) times 0.8; token 3: 2
    policy = -(-3 * 1.5 + 1.28 * 0.8 + 2.0) / 3
    assert result.policy_term.item() == pytest.approx(policy, abs=1e-6)
    assert result.kl.item() == pytest.approx(math.log(2) / 3, abs=1e-6)
    assert result.loss.item() == pytest.approx(policy + 0.1 * math.log(2) / 3 - 0.01 * 2.0, abs=1e-6)
    assert (result.clip_fraction_low.item(), result.clip_fraction_high.item()) == pytest.approx((0.0, 1 / 3))
