"""Chunked log-softmax of the chosen tokens (and the entropy) against torch's
log_softmax + gather and autograd."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.training import selected_logprobs as module
from leaf_plugins.training.selected_logprobs import selected_logprobs, selected_logprobs_and_entropy


@pytest.mark.parametrize("chunk_elements", [7, 64, 1 << 24])  # several positions per chunk, one, all
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradient_match_log_softmax(monkeypatch, chunk_elements, dtype):
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk_elements)
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=generator) * 3).to(dtype)
    tokens = torch.randint(0, 11, (3, 5), generator=generator)
    upstream = torch.randn(3, 5, generator=generator)
    mine = logits.clone().requires_grad_(True)
    theirs = logits.clone().requires_grad_(True)
    got = selected_logprobs(mine, tokens, temperature=0.7)
    expected = torch.log_softmax(theirs.float() / 0.7, dim=-1).gather(2, tokens.unsqueeze(2)).squeeze(2)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    assert mine.grad.dtype == dtype
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)


def test_gradient_by_hand():
    """d/dz log softmax(z)[k] = onehot(k) - softmax(z): [0, 0] logits, token 1 → [-½, ½]."""
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    selected_logprobs(logits, torch.tensor([[1]])).sum().backward()
    assert logits.grad.flatten().tolist() == [-0.5, 0.5]


@pytest.mark.parametrize("chunk_elements", [7, 1 << 24])
def test_entropy_and_its_gradient_match_autograd(monkeypatch, chunk_elements):
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk_elements)
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 9, generator=generator, dtype=torch.float64).float() * 2
    tokens = torch.randint(0, 9, (2, 4), generator=generator)
    up_logprobs, up_entropy = torch.randn(2, 4, generator=generator), torch.randn(2, 4, generator=generator)
    mine, theirs = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    logprobs, entropy = selected_logprobs_and_entropy(mine, tokens, temperature=0.7)
    logp = torch.log_softmax(theirs / 0.7, dim=-1)
    expected_logprobs = logp.gather(2, tokens.unsqueeze(2)).squeeze(2)
    expected_entropy = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-5)  # float32 sums of 9 terms
    (logprobs * up_logprobs + entropy * up_entropy).sum().backward()
    (expected_logprobs * up_logprobs + expected_entropy * up_entropy).sum().backward()
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6)


def test_entropy_of_two_equal_logits_is_log_2_and_stationary():
    """H(½, ½) = log 2, a maximum: its gradient is 0."""
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    _, entropy = selected_logprobs_and_entropy(logits, torch.tensor([[0]]))
    assert entropy.item() == pytest.approx(0.6931471805599453, abs=1e-7)
    entropy.sum().backward()
    assert logits.grad.abs().max().item() < 1e-7
