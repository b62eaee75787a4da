"""Per-token statistics of sampled responses, taken at each generation step.

``generate`` can keep every step's logits and scores (``output_logits`` /
``output_scores``), ``[N, V]`` float32 each per step: at 48 rows × 200 steps × a 156k
vocabulary that is 6 GB per kind, to read three numbers per token. ``TokenStatistics``
is a logits processor that applies the sampling transforms itself (audio tokens
suppressed, temperature, top-p: the processors ``generate`` would build, in its order)
and keeps only ``[N, T]`` statistics plus the last step's ``[N, V]`` log-probabilities
(needed until the next call reveals which token was sampled). It also draws the token
(``keyed_draw.draw``, from the responses' keys) and returns scores that allow only that
token, so ``generate`` samples what the static loop would.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import LogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

from leaf_plugins.rollout.decoding.keyed_draw import draw

__all__ = ["TokenStatistics"]


class TokenStatistics(LogitsProcessor):
    """Records, per generated position, log π(token) and Σ_v π(v)² under the policy
    distribution (raw logits / temperature, no top-p) and log q(token) under the
    sampling distribution (after suppression, temperature and top-p), draws each row's
    token from the sampling distribution with its key, and returns scores that are 0 at
    that token and ``-inf`` elsewhere. Pass it as ``generate``'s only logits processor,
    with ``do_sample=True, temperature=1.0, top_p=1.0, top_k=0`` and no
    ``suppress_tokens`` (it does those).

    :param keys: ``[N]`` int64 the responses' sampling keys (``keyed_draw.response_keys``).
    :param sum_pi_squared: record Σ_v π(v)² (an exp over the vocabulary per step); False:
        ``finish`` returns None for it.
    """

    def __init__(self, temperature: float, top_p: float, suppress: Sequence[int], device: torch.device,
                 keys: torch.Tensor, sum_pi_squared: bool = True) -> None:
        self.temperature = temperature
        self.keys = keys
        self.record_sum_pi_squared = sum_pi_squared
        self.steps = 0  # positions seen
        self.transforms: list[LogitsProcessor] = []
        if suppress:
            self.transforms.append(SuppressTokensLogitsProcessor(list(suppress), device=device))
        if temperature != 1.0:
            self.transforms.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.transforms.append(TopPLogitsWarper(top_p))
        self._policy: list[torch.Tensor] = []  # per step [N]: log π(token)
        self._sampling: list[torch.Tensor] = []  # per step [N]: log q(token)
        self._sum_pi_squared: list[torch.Tensor] = []  # per step [N]
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None  # last step's [N, V] log π and log q
        self.vocab_size = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``scores``: ``[N, V]`` float32 raw logits of this step; ``input_ids`` ends with
        the token sampled at the previous step."""
        if self._pending is not None:
            self._take(input_ids[:, -1])
        policy = torch.log_softmax(scores / self.temperature, dim=-1)  # [N, V]
        if self.record_sum_pi_squared:
            self._sum_pi_squared.append(policy.mul(2).exp_().sum(dim=-1))
        sampling_scores = scores
        for transform in self.transforms:
            sampling_scores = transform(input_ids, sampling_scores)
        sampling = torch.log_softmax(sampling_scores, dim=-1)  # [N, V] log q
        self._pending = (policy, sampling)
        self.vocab_size = scores.shape[-1]
        column = self.steps
        self.steps += 1
        token = draw(torch.softmax(sampling_scores.float(), dim=-1), self.keys.to(scores.device), column)  # [N]
        return torch.full_like(scores, float("-inf")).scatter_(1, token.unsqueeze(1), 0.0)

    def finish(self, last_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``[N, T]`` statistics, given the tokens sampled at the last step
        (``generate``'s last output column): ``logprobs``, ``sampling_logprobs``,
        ``sum_pi_squared`` (None when not recorded). Positions after EOS hold values for
        the padding token."""
        if self._pending is not None:
            self._take(last_tokens)
        return {"logprobs": torch.stack(self._policy, dim=1), "sampling_logprobs": torch.stack(self._sampling, dim=1),
                "sum_pi_squared": torch.stack(self._sum_pi_squared, dim=1) if self.record_sum_pi_squared else None}

    def _take(self, tokens: torch.Tensor) -> None:
        policy, sampling = self._pending  # type: ignore[misc]
        index = tokens.to(policy.device).unsqueeze(1)  # [N, 1]
        self._policy.append(policy.gather(1, index).squeeze(1))
        self._sampling.append(sampling.gather(1, index).squeeze(1))
        self._pending = None
