"""One sampling step on ``[N, V]`` logits: the per-token statistics and the sample,
without host synchronisation.

The same two distributions as ``TokenStatistics`` (the ``generate`` path), in the same
order of transforms:

* policy π: ``log_softmax(logits / temperature)`` (no top-p): log π(token) and Σ_v π(v)²;
* sampling q: audio tokens banned (``-inf``), divided by the temperature, top-p filtered
  as transformers' ``TopPLogitsWarper`` does: in ascending order, the tokens whose
  cumulative probability is ``<= 1 - top_p`` are removed, the most likely one always
  kept. The removed tokens are a prefix of the sorted order, so the kept ones are those
  at least as likely as the first kept one: only the sorted *values* are needed (the
  same cumulative sums as transformers', from the same sorted values), and the kept set
  is ``scores >= threshold``. (Tokens tied in score exactly at the threshold are all
  kept; transformers keeps those its sort happened to place last.) On the CPU the values
  are sorted by numpy, several times faster there than ``torch.sort``.

The token is drawn from q by ``keyed_draw.draw``: inverse transform with a uniform that
is a hash of the row's key (``state.keys``) and the output column, so a response's
tokens do not depend on the other rows of the batch; no data-dependent shapes, no host
round trip, no random generator. Finished rows produce the pad token (as ``generate``
does); their values are dropped when the rollout is assembled.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from leaf_plugins.rollout.decoding.decode_state import DecodeState
from leaf_plugins.rollout.decoding.keyed_draw import draw

__all__ = ["SamplingStep"]


class SamplingStep:
    """Statistics, sample and bookkeeping of one step, written into a ``DecodeState``."""

    def __init__(self, temperature: float, top_p: float, banned: Sequence[int], vocab_size: int, eos_token_id: int,
                 pad_token_id: int, device: torch.device, sum_pi_squared: bool = True) -> None:
        self.temperature = temperature
        self.record_sum_pi_squared = sum_pi_squared  # False: Σπ² (an exp over the vocabulary) is not computed
        self.top_p = top_p
        banned_ids = [token for token in banned if 0 <= token < vocab_size]
        self.ban = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # [V]: -inf on banned ids, else 0
        self.ban[banned_ids] = float("-inf")
        self.any_banned = bool(banned_ids)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    def sampling_scores(self, scaled: torch.Tensor) -> torch.Tensor:
        """``[N, V]`` scores of the sampling distribution q (``-inf`` outside it), from
        the ``[N, V]`` float32 logits divided by the temperature."""
        scores = scaled + self.ban if self.any_banned else scaled  # x + 0 is x: the same scores as a masked fill
        if self.top_p >= 1.0:
            return scores
        ordered = _sorted_values(scores)  # [N, V] ascending
        removable = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - self.top_p)  # a prefix of each row
        removed = removable.sum(dim=-1, keepdim=True).clamp_(max=scores.shape[-1] - 1)  # the most likely stays
        threshold = ordered.gather(1, removed)  # [N, 1] the least likely kept score
        return scores.masked_fill(scores < threshold, float("-inf"))

    def __call__(self, logits: torch.Tensor, state: DecodeState) -> None:
        """Sample one token per row from ``[N, V]`` float32 ``logits`` and record it and
        its statistics in column ``state.column``; advance the state."""
        scaled = logits / self.temperature if self.temperature != 1.0 else logits
        policy = torch.log_softmax(scaled, dim=-1)  # [N, V]
        sampling = torch.softmax(self.sampling_scores(scaled), dim=-1)  # [N, V] q (exp of -inf is slow on the CPU)
        column = state.column
        token = draw(sampling, state.keys, column).masked_fill_(state.finished, self.pad_token_id)  # [N]
        chosen = token.unsqueeze(1)  # [N, 1]
        state.generated.index_copy_(1, column, chosen)
        state.logprobs.index_copy_(1, column, policy.gather(1, chosen))
        state.sampling_logprobs.index_copy_(1, column, sampling.gather(1, chosen).log_())
        if self.record_sum_pi_squared:
            state.sum_pi_squared.index_copy_(1, column, policy.mul(2).exp_().sum(dim=-1, keepdim=True))  # [N, 1]
        state.finished.logical_or_(token == self.eos_token_id)
        state.tokens.copy_(token)
        state.positions.add_(1)
        column.add_(1)


def _sorted_values(scores: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` each row of ``scores`` in ascending order (values only)."""
    if scores.device.type == "cpu":
        return torch.from_numpy(np.sort(scores.numpy(), axis=-1))
    return torch.sort(scores, dim=-1).values
