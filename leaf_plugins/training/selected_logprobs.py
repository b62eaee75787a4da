"""log-softmax of the chosen tokens only, in chunks, with a matching backward; and, on
request, the distribution's entropy at each position.

``torch.log_softmax(logits.float() / temperature)`` over ``[rows, T, V]`` makes a float32
copy of the logits and keeps another for the backward pass; at 8 rows × 200 tokens × a
156k vocabulary that is 1 GB each, to keep ``[rows, T]`` numbers. ``selected_logprobs``
converts a slice of positions at a time and saves nothing but the logits it was given
(which the model's graph holds anyway); the backward recomputes each slice's softmax.

The entropy ``H = −Σ_v p_v log p_v`` of ``p = softmax(logits / temperature)`` comes from
the same slices (one more elementwise pass over each); its gradient,
``∂H/∂z_v = −p_v (log p_v + H)`` with ``z = logits / temperature``, joins the log-probs'
in the same recomputed slices.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["selected_logprobs", "selected_logprobs_and_entropy", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 24
"""float32 elements converted at once (64 MB): positions per chunk = this // V."""


def selected_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[R, T]`` float32 ``log_softmax(logits / temperature)[token]``, differentiable.

    :param logits: ``[R, T, V]`` in the model's dtype.
    :param tokens: ``[R, T]`` int64 ids in ``[0, V)``.
    """
    return _SelectedLogprobs.apply(logits, tokens, temperature, False)[0]


def selected_logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor,
                                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``selected_logprobs`` and the ``[R, T]`` float32 entropy of
    ``softmax(logits / temperature)`` at each position, both differentiable."""
    logprobs, entropy = _SelectedLogprobs.apply(logits, tokens, temperature, True)
    return logprobs, entropy


def _step(positions: int, vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab)


class _SelectedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        flat = logits.reshape(-1, logits.shape[-1])  # [R*T, V]
        index = tokens.reshape(-1, 1)  # [R*T, 1]
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        entropy = torch.zeros(flat.shape[0], dtype=torch.float32, device=logits.device)
        step = _step(*flat.shape)
        for start in range(0, flat.shape[0], step):
            part = torch.log_softmax(flat[start : start + step].float() / temperature, dim=-1)  # [C, V]
            out[start : start + step] = part.gather(1, index[start : start + step]).squeeze(1)
            if with_entropy:
                entropy[start : start + step] = -(part.exp() * part).sum(dim=-1)
        ctx.save_for_backward(logits, tokens, entropy)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        ctx.mark_non_differentiable(*(() if with_entropy else (entropy,)))
        return out.view(tokens.shape), entropy.view(tokens.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None,
                 grad_entropy: torch.Tensor | None) -> tuple[torch.Tensor, None, None, None]:
        logits, tokens, entropy = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])
        index = tokens.reshape(-1, 1)
        upstream = (grad if grad is not None else torch.zeros_like(entropy.view(tokens.shape))).reshape(-1, 1).float()
        entropy_upstream = (grad_entropy.reshape(-1, 1).float()
                            if ctx.with_entropy and grad_entropy is not None else None)  # [R*T, 1]
        out = torch.empty_like(flat)
        step = _step(*flat.shape)
        for start in range(0, flat.shape[0], step):
            rows = slice(start, start + step)
            logp = torch.log_softmax(flat[rows].float() / ctx.temperature, dim=-1)  # [C, V]
            probabilities = logp.exp()
            part = probabilities * -upstream[rows]
            part.scatter_add_(1, index[rows], upstream[rows])
            if entropy_upstream is not None:  # dH/dz = -p (log p + H)
                part -= probabilities * (logp + entropy[rows].unsqueeze(1)) * entropy_upstream[rows]
            out[rows] = part.div_(ctx.temperature)
        return out.view_as(logits), None, None, None
