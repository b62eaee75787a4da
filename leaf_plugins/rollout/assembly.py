"""What every rollout backend shares: the ``Rollout`` of generated ids and their
per-token values (cut after the first EOS, padded, decoded), and the audio placeholder
ids no response may contain."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from leaf_plugins.core.backbone import LoadedBackbone
from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import Rollout

__all__ = ["assemble_rollout", "audio_token_ids", "response_lengths", "SURPRISAL_SOURCES"]

SURPRISAL_SOURCES = ("sampling", "policy")
"""``surprisal_from``: the sampling distribution (after temperature and top-p) or the policy."""


def assemble_rollout(tokenizer: Any, generated: torch.Tensor, logprobs: torch.Tensor, surprisal: torch.Tensor,
                     sum_pi_squared: torch.Tensor | None, vocab_size: int, group_size: int,
                     group_ids: Sequence[int] | None) -> Rollout:
    """The ``Rollout`` of ``[N, T]`` generated ids (K consecutive rows per prompt) and
    their per-token values: cut after the first EOS, padded with ``-1`` / 0, decoded
    (``sum_pi_squared`` None: not computed, left out of the batch)."""
    device = generated.device
    lengths = response_lengths(generated, tokenizer.eos_token_id)  # [N]
    real = torch.arange(generated.shape[1], device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    prompt_index = torch.arange(generated.shape[0] // group_size, device=device).repeat_interleave(group_size)  # [N]
    ids = torch.as_tensor(list(group_ids), device=device)[prompt_index] if group_ids is not None else prompt_index
    batch = RolloutBatch(
        tokens=torch.where(real, generated, -1).cpu(),
        lengths=lengths.cpu(),
        group_ids=ids.cpu(),
        rewards=torch.zeros(generated.shape[0]),
        surprisal=torch.where(real, surprisal, 0.0).cpu(),
        logprobs=torch.where(real, logprobs, 0.0).cpu(),
        sum_pi_squared=torch.where(real, sum_pi_squared, 0.0).cpu() if sum_pi_squared is not None else None,
        vocab_size=vocab_size,  # the model may sample ids beyond len(tokenizer) (padded embeddings)
    )
    texts = tokenizer.batch_decode(torch.where(real, generated, tokenizer.pad_token_id), skip_special_tokens=True)
    return Rollout(batch=batch, prompt_index=prompt_index.cpu(), texts=texts)


def audio_token_ids(loaded: LoadedBackbone) -> list[int]:
    """Ids of the audio placeholder tokens (never part of a response: the processor
    would take them for audio slots), from the tokenizer, the processor and the model
    config (a tokenizer reloaded from disk may have lost its ``audio_token`` attributes)."""
    tokenizer = loaded.tokenizer
    found: set[int] = set()
    for source in (tokenizer, loaded.processor):
        for name in ("audio_token", "audio_bos_token", "audio_eos_token"):
            token = getattr(source, name, None)
            if isinstance(token, str):
                number = tokenizer.convert_tokens_to_ids(token)
                if isinstance(number, int) and number != tokenizer.unk_token_id:
                    found.add(number)
    for name in ("audio_token_index", "audio_token_id"):
        number = getattr(loaded.model.config, name, None)
        if isinstance(number, int):
            found.add(number)
    return sorted(found)


def response_lengths(generated: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """``[N]``: up to and including the first EOS, or every generated token."""
    is_eos = generated == eos_token_id  # [N, T]
    first = is_eos.to(torch.uint8).argmax(dim=1)
    return torch.where(is_eos.any(dim=1), first + 1, generated.shape[1])
