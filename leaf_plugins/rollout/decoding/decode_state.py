"""The decode loop's per-row state and outputs, in static device tensors.

Every step reads and writes these in place (the next input token, its position, the
output column, the finished flags, the per-token outputs), so the step has fixed
addresses and can be captured once as a CUDA graph and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["DecodeState"]


@dataclass
class DecodeState:
    """What the decode step reads and writes, one row per response."""

    tokens: torch.Tensor  # [N] int64: each row's last sample (the next step's input)
    positions: torch.Tensor  # [N] int64: the position of the last sample once fed
    column: torch.Tensor  # [1] int64: the output column the next sample goes to
    finished: torch.Tensor  # [N] bool: the row has sampled EOS (it now produces the pad token)
    generated: torch.Tensor  # [N, T] int64: samples (the pad token after EOS)
    logprobs: torch.Tensor  # [N, T] float32: log π(token), the policy distribution
    sampling_logprobs: torch.Tensor  # [N, T] float32: log q(token), the sampling distribution
    sum_pi_squared: torch.Tensor  # [N, T] float32: Σ_v π(v)²
    keys: torch.Tensor  # [N] int64: each response's sampling key (``keyed_draw.response_keys``)

    @classmethod
    def start(cls, prompt_lengths: torch.Tensor, new_tokens: int, pad_token_id: int,
              keys: torch.Tensor) -> "DecodeState":
        """The state before the first sample.

        :param prompt_lengths: ``[N]`` the real (unpadded) prompt length of each row: its
            first sample is fed at that position.
        :param keys: ``[N]`` int64 the responses' sampling keys.
        """
        rows, device = prompt_lengths.shape[0], prompt_lengths.device

        def values() -> torch.Tensor:
            return torch.zeros(rows, new_tokens, dtype=torch.float32, device=device)

        return cls(
            tokens=torch.full((rows,), pad_token_id, dtype=torch.int64, device=device),
            positions=prompt_lengths.to(torch.int64) - 1,  # advanced by every sample
            column=torch.zeros(1, dtype=torch.int64, device=device),
            finished=torch.zeros(rows, dtype=torch.bool, device=device),
            generated=torch.full((rows, new_tokens), pad_token_id, dtype=torch.int64, device=device),
            logprobs=values(),
            sampling_logprobs=values(),
            sum_pi_squared=values(),
            keys=keys.to(device=device, dtype=torch.int64),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state, in field order."""
        return [getattr(self, field.name) for field in fields(self)]

    def snapshot(self) -> "DecodeState":
        """A copy of the state (for ``restore``)."""
        return DecodeState(*(tensor.clone() for tensor in self.tensors()))

    def restore(self, saved: "DecodeState") -> None:
        """Write ``saved`` back into these tensors, in place (their addresses stay)."""
        for tensor, value in zip(self.tensors(), saved.tensors()):
            tensor.copy_(value)

    def restart(self, prompt_lengths: torch.Tensor, pad_token_id: int, keys: torch.Tensor) -> None:
        """Reset the state in place to ``start``'s for a new rollout of the same shape
        (a captured step keeps reading and writing these very tensors)."""
        self.restore(DecodeState.start(prompt_lengths, self.generated.shape[1], pad_token_id, keys))
