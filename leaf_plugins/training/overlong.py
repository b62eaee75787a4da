"""Responses cut at ``rollout.max_new_tokens`` (no EOS): truncated, and what a run does
with them (``rollout.overlong``).

* ``keep`` (the paper's): they train like any other response;
* ``mask``: they leave the loss (their tokens weigh 0; the estimator still sees their
  rewards, so their groups' baselines are as sampled);
* ``penalty``: DAPO's soft overlong punishment, added to the reward of every response:
  0 up to ``L − B`` tokens, then falling linearly to ``−factor`` at ``L``
  (``L = max_new_tokens``, ``B = rollout.overlong_buffer``, a fifth of ``L`` unset;
  ``factor = rollout.overlong_penalty_factor``).
"""

from __future__ import annotations

import torch

__all__ = ["OVERLONG_POLICIES", "truncated", "overlong_penalty", "overlong_buffer"]

OVERLONG_POLICIES = ("keep", "mask", "penalty")


def truncated(tokens: torch.Tensor, lengths: torch.Tensor, max_new_tokens: int, eos_token_id: int) -> torch.Tensor:
    """``[N]`` bool: the responses cut at ``max_new_tokens`` without an EOS.

    :param tokens: ``[N, T]`` response ids (EOS included, -1 after).
    :param lengths: ``[N]`` their lengths.
    """
    last = tokens.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # [N] each response's last token
    return (lengths >= max_new_tokens) & (last != eos_token_id)


def overlong_buffer(max_new_tokens: int, buffer: int | None) -> int:
    """The tokens before ``max_new_tokens`` over which the penalty ramps up (a fifth of
    ``max_new_tokens`` when unset; at least 1, at most ``max_new_tokens``)."""
    return min(max(buffer if buffer is not None else max_new_tokens // 5, 1), max_new_tokens)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float) -> torch.Tensor:
    """``[N]`` float32: DAPO's soft length penalty of responses of ``lengths``:
    ``−factor · max(0, length − (max_new_tokens − buffer)) / buffer``."""
    excess = (lengths.to(torch.float32) - (max_new_tokens - buffer)).clamp(min=0)  # [N]
    return -factor * excess / buffer
