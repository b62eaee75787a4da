"""The clipped, KL-regularised token loss (paper Eq. 1) on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from leaf_plugins.training.loss import policy_loss


def test_loss_by_hand():
    logprobs = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.9]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.1, 0.9]]))
    reference = torch.log(torch.tensor([[0.4, 0.3, 0.2], [0.6, 0.2, 0.9]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0], [2.0, -0.5, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    result = policy_loss(logprobs, old, reference, advantages, mask, clip_epsilon=0.2, kl_coefficient=0.1)
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
                         torch.ones(1, 2, dtype=torch.bool))
    result.loss.backward()
    # by hand: uniform π = 1/4, ratio 1 (no clipping), KL gradient 0 at π = π_ref; the token
    # mean gives d loss / d log π_t = -A_t / 2 and d log π_t / d logit_v = [v = a_t] - 1/4
    expected = torch.tensor([[[0.125, -0.375, 0.125, 0.125], [-0.125, -0.125, -0.125, 0.375]]])
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-7)  # float32 of eighths: exact up to rounding
