"""Keyed LoRA dropout: the share it drops, and masks that follow a token's key alone.

The drop share is checked against a binomial bound; the keying against the masks of the
same tokens put in another batch, another order and another width.
"""

from __future__ import annotations

import math

import pytest
import torch

from leaf_plugins.training.keyed_dropout import KeyedDropout, set_token_keys


@pytest.fixture(autouse=True)
def no_keys_left_set():
    yield
    set_token_keys(None)


def mask(layer: KeyedDropout, keys: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, S, width]`` bool: the elements ``layer`` keeps for tokens with ``[B, S]`` ``keys``."""
    set_token_keys(keys)
    return layer(torch.ones(*keys.shape, width)) != 0


@pytest.mark.parametrize("p", [0.05, 0.1, 0.3])
def test_the_drop_share_is_p(p):
    """Over 240,000 elements the dropped share is within 5 binomial standard deviations
    of p (rounded up to a multiple of 2^-16, 1.5e-5 at most); kept ones are scaled by
    1 / (1 − p)."""
    layer = KeyedDropout(p, salt=11).train()
    keys = torch.arange(40 * 100, dtype=torch.int64).reshape(40, 100) * 1_000_003
    set_token_keys(keys)
    out = layer(torch.ones(40, 100, 60))
    dropped = float((out == 0).float().mean())
    bound = 5 * math.sqrt(p * (1 - p) / out.numel())
    assert abs(dropped - p) < bound + 2 ** -16
    torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / (1 - p)))


def test_each_feature_and_layer_draws_its_own_mask():
    """Features of one token (the four uniforms of a hash among them) and two layers'
    masks agree on about p² + (1 − p)² of elements, as independent draws do, not always."""
    p = 0.3
    keys = torch.arange(2000, dtype=torch.int64).reshape(20, 100)
    first = mask(KeyedDropout(p, salt=1).train(), keys, 8)
    second = mask(KeyedDropout(p, salt=2).train(), keys, 8)
    independent = p * p + (1 - p) * (1 - p)  # 0.58
    for a, b in [(first, second), (first[..., 0], first[..., 1]), (first[..., 0], first[..., 4])]:
        agreement = float((a == b).float().mean())
        assert abs(agreement - independent) < 5 * math.sqrt(independent * (1 - independent) / a.numel())


def test_a_tokens_mask_follows_its_key_not_its_batch():
    """The same tokens in another batch, in another order, give the same masks; a layer's
    first H features are the same whatever its width beyond them (odd widths included)."""
    layer = KeyedDropout(0.2, salt=5).train()
    keys = torch.arange(60, dtype=torch.int64).reshape(6, 10) * 977
    whole = mask(layer, keys, 13)
    order = torch.tensor([4, 0, 5, 2])
    assert torch.equal(mask(layer, keys[order], 13), whole[order])
    assert torch.equal(mask(layer, keys[:, 3:7], 13), whole[:, 3:7])
    assert torch.equal(mask(layer, keys, 16)[..., :13], whole)


def test_without_keys_or_in_eval_it_is_torchs_dropout_or_nothing():
    """No keys set: torch's generator draws the mask (as ``nn.Dropout``); eval mode and
    p = 0 leave the input as it is."""
    x = torch.ones(4, 5, 6)
    layer = KeyedDropout(0.5, salt=3).train()
    torch.manual_seed(0)
    expected = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(0)
    assert torch.equal(layer(x), expected)
    set_token_keys(torch.zeros(4, 5, dtype=torch.int64))
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(KeyedDropout(0.0, salt=3).train()(x), x)
