"""Rollout: K sampled responses per prompt with their log-probabilities and surprisal,
and teacher-forced log-probabilities of given responses (for the loss).

Two distributions are involved at every sampled position:

* the *sampling* distribution: the model's logits divided by the temperature, then
  top-p filtered (what ``generate`` samples from);
* the *policy* distribution: the logits divided by the temperature, without top-p.

``logprobs`` (π_old in the loss ratio) and ``sum_pi_squared`` (Σ_v π_old(v)², which the
variance-aware estimators read) are always under the policy distribution, which is
what ``response_logprobs`` computes for π_θ and π_ref, so the ratio is 1 before the first
update. ``surprisal_from`` chooses the distribution of the surprisal LEAF uses to pick
boundaries: ``"sampling"`` (the default, as the authors' code: after temperature and
top-p) or ``"policy"`` (``-logprobs``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import LogitsProcessorList

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import Rollout
from leaf_plugins.training.prompt_embedding import embed_prompts, head_on_positions, prompt_embeddings_in_front
from leaf_plugins.training.selected_logprobs import selected_logprobs
from leaf_plugins.training.token_stats import TokenStatistics

__all__ = ["Rollout", "sample_responses", "assemble_rollout", "response_logprobs", "audio_token_ids",
           "SURPRISAL_SOURCES"]

SURPRISAL_SOURCES = ("sampling", "policy")


@torch.no_grad()
def sample_responses(
    model: torch.nn.Module,
    loaded: LoadedBackbone,
    inputs: dict[str, torch.Tensor],
    group_size: int,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_p: float = 0.9,
    surprisal_from: str = "sampling",
    group_ids: Sequence[int] | None = None,
) -> Rollout:
    """Sample ``group_size`` responses for every prompt of ``inputs`` (left padded).

    The prompts are embedded once (``inputs["inputs_embeds"]`` when the caller already
    has them, see ``embed_prompts``) and the embeddings expanded to the K rows, so the
    audio encoder runs once per prompt. The per-token statistics are taken at each step
    (``TokenStatistics``): memory ``O(N·T)``, not ``O(N·T·V)``. Generation stops at EOS,
    which belongs to the response; what follows is padding.
    """
    if surprisal_from not in SURPRISAL_SOURCES:
        raise ValueError(f"surprisal_from must be one of {SURPRISAL_SOURCES}, got {surprisal_from!r}")
    tokenizer = loaded.tokenizer
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    statistics = TokenStatistics(temperature, top_p, audio_token_ids(loaded), device)
    with head_on_positions(model, slice(-1, None)):  # the prefill projects the last position only, not [N, L, V]
        generated = model.generate(
            inputs_embeds=embeddings.repeat_interleave(group_size, dim=0),  # [N, L, H]
            attention_mask=inputs["attention_mask"].repeat_interleave(group_size, dim=0),
            logits_processor=LogitsProcessorList([statistics]),
            do_sample=True,
            temperature=1.0,  # TokenStatistics applies the temperature, top-p and the audio-token ban
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # [N, T]: with inputs_embeds only, generate returns the new tokens alone
    recorded = statistics.finish(generated[:, -1])  # [N, T] each
    surprisal = -recorded["sampling_logprobs"] if surprisal_from == "sampling" else -recorded["logprobs"]
    return assemble_rollout(tokenizer, generated, recorded["logprobs"], surprisal, recorded["sum_pi_squared"],
                            statistics.vocab_size, group_size, group_ids)


def assemble_rollout(tokenizer: Any, generated: torch.Tensor, logprobs: torch.Tensor, surprisal: torch.Tensor,
                     sum_pi_squared: torch.Tensor, vocab_size: int, group_size: int,
                     group_ids: Sequence[int] | None) -> Rollout:
    """The ``Rollout`` of ``[N, T]`` generated ids (K consecutive rows per prompt) and
    their per-token values: cut after the first EOS, padded with ``-1`` / 0, decoded."""
    device = generated.device
    lengths = _response_lengths(generated, tokenizer.eos_token_id)  # [N]
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
        sum_pi_squared=torch.where(real, sum_pi_squared, 0.0).cpu(),
        vocab_size=vocab_size,  # the model may sample ids beyond len(tokenizer) (padded embeddings)
    )
    texts = tokenizer.batch_decode(torch.where(real, generated, tokenizer.pad_token_id), skip_special_tokens=True)
    return Rollout(batch=batch, prompt_index=prompt_index.cpu(), texts=texts)


def response_logprobs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    lengths: torch.Tensor,
    prompt_index: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``[N, T]`` float32 log-probabilities of the response tokens under the policy
    distribution (logits / temperature), teacher forced, 0 on padding; differentiable.

    The prompts' embeddings (``inputs["inputs_embeds"]``, or computed here once per
    prompt) are shared by their responses; the output head runs on the ``T`` predicting
    positions only and the log-softmax is taken in chunks (``selected_logprobs``).

    :param inputs: the prompts' model inputs (left padded), one row per prompt.
    :param responses: ``[N, T]`` response token ids, ``-1`` on padding.
    :param prompt_index: ``[N]`` the prompt row of each response.
    """
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    responses, lengths, prompt_index = responses.to(device), lengths.to(device), prompt_index.to(device)
    width = responses.shape[1]
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    tokens = torch.where(real, responses, 0)  # [N, T]
    prompt_ids, prompt_mask = inputs["input_ids"][prompt_index], inputs["attention_mask"][prompt_index]  # [N, P]
    prompt_width = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, tokens], dim=1)  # [N, P+T]; the prompt part is replaced by its embeddings
    mask = torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1)  # [N, P+T]
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # as generate computes them for left padding
    with prompt_embeddings_in_front(model, embeddings[prompt_index]), \
            head_on_positions(model, slice(prompt_width - 1, prompt_width + width - 1)):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [N, T, V]
    return torch.where(real, selected_logprobs(logits, tokens, temperature), 0.0)


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


def _response_lengths(generated: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """``[N]``: up to and including the first EOS, or every generated token."""
    is_eos = generated == eos_token_id  # [N, T]
    first = is_eos.to(torch.uint8).argmax(dim=1)
    return torch.where(is_eos.any(dim=1), first + 1, generated.shape[1])
