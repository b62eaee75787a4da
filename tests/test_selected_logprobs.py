"""Chunked log-softmax of the chosen tokens against torch's log_softmax + gather."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.training import selected_logprobs as module
from leaf_plugins.training.selected_logprobs import selected_logprobs


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
