"""Sampling that depends on *which* response is sampled, never on the batch it is in.

Every response has a 64-bit key, a hash of the rollout's seed, its prompt's group id and
its index k among the prompt's K responses (``response_keys``). The token at output
column t is drawn from the sampling distribution q by inverse transform with the
uniform ``hash(key, t)`` (``draw``): the first token whose cumulative probability, in
vocabulary order, exceeds ``u · Σq``. So a response's tokens are a function of its key
and its logits alone: the same prompt sampled in a batch of 3 prompts or of 6, on one
process or on the third of three, in evaluation chunks of 8 or of 16, gets the same
responses (up to the rounding of the logits, which a batch's shape can move in the last
bits). No random generator is read, so the draw needs no host synchronisation, replays
inside a captured CUDA graph like any other kernel, and is the same for every rollout
backend that uses it.

The hash is splitmix64's finaliser in wrapping int64 arithmetic. The uniform keeps 24
bits (exact in float32); a token whose probability is below the cumulative sum's float32
rounding (about 2^-24 of the total) cannot be drawn.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["response_keys", "keyed_uniforms", "draw", "mix64"]

_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment
_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_UNIFORM_BITS = 24  # a float32 mantissa holds them exactly


def _signed(word: int) -> int:
    """A 64-bit word as the int64 with the same bits."""
    return word - (1 << 64) if word >= 1 << 63 else word


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's ``>>`` is arithmetic on signed ints)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, elementwise on an int64 tensor (arithmetic wraps): a
    bijection of 64-bit words in which every output bit depends on every input bit."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _shift_right(x, 30)) * _signed(_MULTIPLIERS[0])
    x = (x ^ _shift_right(x, 27)) * _signed(_MULTIPLIERS[1])
    return x ^ _shift_right(x, 31)


def response_keys(seed: int, group_ids: Sequence[int] | torch.Tensor, group_size: int,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """``[P·K]`` int64 keys of the K responses of each prompt, in rollout order (a
    prompt's K responses are consecutive rows).

    :param seed: the rollout's seed (any integer that fits in int64).
    :param group_ids: ``[P]`` one id per prompt; a prompt's responses get the same keys
        under the same seed and id wherever it stands in the batch.
    """
    seeds = mix64(torch.tensor([seed], dtype=torch.int64, device=device))  # [1]
    ids = torch.as_tensor(group_ids, dtype=torch.int64).to(device)  # [P]
    groups = mix64(seeds ^ mix64(ids))  # [P]
    within = torch.arange(group_size, dtype=torch.int64, device=device)  # [K]
    return mix64(groups.repeat_interleave(group_size) + within.repeat(ids.numel()))  # [P·K]


def keyed_uniforms(keys: torch.Tensor, column: torch.Tensor | int) -> torch.Tensor:
    """``[N]`` float32 uniforms on ``[0, 1 - 2^-24]``, one per key, for output column
    ``column`` (an int or a ``[1]`` int64 device tensor: no host synchronisation)."""
    column = torch.as_tensor(column, dtype=torch.int64, device=keys.device)
    bits = _shift_right(mix64(keys ^ mix64(column)), 64 - _UNIFORM_BITS)  # [N] in [0, 2^24)
    return bits.to(torch.float32) * (2.0 ** -_UNIFORM_BITS)


def draw(probabilities: torch.Tensor, keys: torch.Tensor, column: torch.Tensor | int) -> torch.Tensor:
    """``[N]`` int64 tokens drawn from ``[N, V]`` float32 ``probabilities`` (each row's
    sampling distribution, zeros outside it) by inverse transform with the rows' keyed
    uniforms at ``column``: the first token whose cumulative probability exceeds
    ``u · total``. That token has a positive probability, and one always exists: with
    ``u <= 1 - 2^-24`` the float32 product ``u · total`` rounds below ``total`` (its
    distance to ``total`` is more than half of the spacing of floats below it)."""
    cumulative = probabilities.cumsum(dim=-1)  # [N, V]
    target = keyed_uniforms(keys, column).unsqueeze(1) * cumulative[:, -1:]  # [N, 1]
    return torch.searchsorted(cumulative, target, right=True).squeeze(1)  # [N]
