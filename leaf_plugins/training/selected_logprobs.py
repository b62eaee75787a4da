"""log-softmax of the chosen tokens only, in chunks, with a matching backward.

``torch.log_softmax(logits.float() / temperature)`` over ``[rows, T, V]`` makes a float32
copy of the logits and keeps another for the backward pass; at 8 rows × 200 tokens × a
156k vocabulary that is 1 GB each, to keep ``[rows, T]`` numbers. ``selected_logprobs``
converts a slice of positions at a time and saves nothing but the logits it was given
(which the model's graph holds anyway); the backward recomputes each slice's softmax.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["selected_logprobs", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 24
"""float32 elements converted at once (64 MB): positions per chunk = this // V."""


def selected_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[R, T]`` float32 ``log_softmax(logits / temperature)[token]``, differentiable.

    :param logits: ``[R, T, V]`` in the model's dtype.
    :param tokens: ``[R, T]`` int64 ids in ``[0, V)``.
    """
    return _SelectedLogprobs.apply(logits, tokens, temperature)


def _chunks(positions: int, vocab: int) -> range:
    return range(0, positions, max(1, CHUNK_ELEMENTS // vocab))


class _SelectedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])  # [R*T, V]
        index = tokens.reshape(-1, 1)  # [R*T, 1]
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        step = max(1, CHUNK_ELEMENTS // flat.shape[1])
        for start in _chunks(flat.shape[0], flat.shape[1]):
            part = torch.log_softmax(flat[start : start + step].float() / temperature, dim=-1)
            out[start : start + step] = part.gather(1, index[start : start + step]).squeeze(1)
        ctx.save_for_backward(logits, tokens)
        ctx.temperature = temperature
        return out.view(tokens.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, tokens = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])
        index = tokens.reshape(-1, 1)
        upstream = grad.reshape(-1, 1).float()  # [R*T, 1]
        out = torch.empty_like(flat)
        step = max(1, CHUNK_ELEMENTS // flat.shape[1])
        for start in _chunks(flat.shape[0], flat.shape[1]):
            rows = slice(start, start + step)
            probabilities = torch.softmax(flat[rows].float() / ctx.temperature, dim=-1)  # [C, V]
            part = probabilities.mul_(-upstream[rows])
            part.scatter_add_(1, index[rows], upstream[rows])
            out[rows] = part.div_(ctx.temperature)
        return out.view_as(logits), None, None
