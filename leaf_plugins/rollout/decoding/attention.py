"""Grouped-query attention without repeating key/value heads.

With ``g = heads / kv_heads`` query heads per key/value head (Granite Speech 3.3 8B:
32 / 8), Hugging Face's attention first copies every key/value head ``g`` times over the
whole cache (``repeat_kv``). Here the ``g`` query heads of one key/value head are laid
side by side as extra query rows of one matrix product instead (``[.., g·L, d] @
[.., d, L]``): the same products, no copy of the keys or values. Scores are taken in the
model's dtype and the softmax in float32, as the Hugging Face eager attention does.
"""

from __future__ import annotations

import torch

__all__ = ["prompt_attention", "prompt_attention_bias", "shared_prefix_attention"]


def prompt_attention_bias(mask: torch.Tensor) -> torch.Tensor:
    """``[P, 1, L, L]`` float32 additive bias of the prefill: query ``i`` sees key
    ``j <= i`` when ``j`` is a prompt token (not left padding). A padding query also
    sees itself, so its row is never empty and its keys and values stay finite (they
    are masked for every real query; ``0 × NaN`` would not be).

    :param mask: ``[P, L]`` the prompts' attention mask.
    """
    width = mask.shape[1]
    positions = torch.arange(width, device=mask.device)
    causal = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [L, L]: key <= query
    allowed = (causal & mask.bool().unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=mask.device)  # [P, L, L]
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=mask.device)
    return bias.masked_fill(~allowed, float("-inf")).unsqueeze(1)


def prompt_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """``[P, L, heads · d]`` attention of the prompts over themselves.

    :param query: ``[P, heads, L, d]``.
    :param keys: ``[P, kv_heads, L, d]``; ``values`` likewise.
    :param bias: ``[P, 1, L, L]`` from ``prompt_attention_bias``.
    """
    prompts, heads, width, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    grouped = query.reshape(prompts, kv_heads, group * width, dim)  # query head h uses key/value head h // group
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float().mul_(scale)  # [P, kv, g·L, L]
    scores = scores.view(prompts, kv_heads, group, width, width).add_(bias.unsqueeze(1))
    weights = torch.softmax(scores, dim=-1).to(values.dtype).view(prompts, kv_heads, group * width, width)
    out = torch.matmul(weights, values)  # [P, kv, g·L, d]
    return out.view(prompts, heads, width, dim).transpose(1, 2).reshape(prompts, width, heads * dim)


def shared_prefix_attention(query: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor,
                            prefix_bias: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            span_bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """``[N, heads · d]`` attention of one new token per row over its prompt's keys and
    values (shared by the prompt's K consecutive rows) and its own generated ones, with
    one softmax over both (exactly attention over the concatenated cache).

    :param query: ``[N, heads, d]``, N = P · K.
    :param prefix_keys: ``[P, kv_heads, L, d]``; ``prefix_values`` likewise.
    :param prefix_bias: ``[P, 1, 1, L]``: -inf on left padding.
    :param keys: ``[N, kv_heads, S, d]`` the rows' generated slots; ``values`` likewise.
    :param span_bias: ``[S]``: -inf on the slots not written yet (None: all are written).
    """
    rows, heads, dim = query.shape
    prompts, kv_heads, width, _ = prefix_keys.shape
    group, per_prompt, span = heads // kv_heads, rows // prompts, keys.shape[2]
    # the prompt's part: the K rows and g heads of one key/value head as K·g query rows
    shared = query.view(prompts, per_prompt, kv_heads, group, dim).transpose(1, 2)  # [P, kv, K, g, d]
    shared = shared.reshape(prompts, kv_heads, per_prompt * group, dim)
    prefix_scores = torch.matmul(shared, prefix_keys.transpose(-1, -2)).float().mul_(scale)  # [P, kv, K·g, L]
    prefix_scores = prefix_scores.add_(prefix_bias).view(prompts, kv_heads, per_prompt, group, width)
    own = query.view(rows, kv_heads, group, dim)
    own_scores = torch.matmul(own, keys.transpose(-1, -2)).float().mul_(scale)  # [N, kv, g, S]
    if span_bias is not None:
        own_scores = own_scores.add_(span_bias)
    own_scores = own_scores.view(prompts, per_prompt, kv_heads, group, span).transpose(1, 2)  # [P, kv, K, g, S]
    weights = torch.softmax(torch.cat([prefix_scores, own_scores], dim=-1), dim=-1).to(values.dtype)
    prefix_weights = weights[..., :width].reshape(prompts, kv_heads, per_prompt * group, width)
    own_weights = weights[..., width:].transpose(1, 2).reshape(rows, kv_heads, group, span)
    out = torch.matmul(prefix_weights, prefix_values).view(prompts, kv_heads, per_prompt, group, dim)
    out = out.transpose(1, 2).reshape(rows, kv_heads, group, dim) + torch.matmul(own_weights, values)
    return out.reshape(rows, heads * dim)
