"""Teacher-forced log-probabilities of given responses (π_θ and π_ref for the loss).

The K responses of a prompt share it as their prefix. The *full* pass runs every row
over its prompt and response, so the prompt (audio slots included: 101 positions in the
demo, 328 for a 30 s clip) goes through the network K times. The *shared-prefix* pass
runs each prompt once, keeps its keys and values (Hugging Face's ``DynamicCache``),
selects them for the prompt's K rows and runs only the response tokens over them. The
arithmetic is the same attention over the same keys; gradients flow back through the
selected keys and values into the prompt's single pass, so the gradient is the full
pass's, summed over rows in a different order (float32: equal to ~1e-6 relative, see
``tests/test_teacher_forcing.py``). With LoRA dropout on, a prompt position's dropout
mask is shared by the prompt's K rows (the same distribution per row, correlated across
rows).

The shared pass is used wherever it saves work (more rows than prompts) and the model
can return its cache: not in a pass that records gradients through checkpointed layers
(``optim.activation_checkpointing``; transformers drops the cache there), where the full
pass runs.
"""

from __future__ import annotations

import inspect

import torch

from leaf_plugins.training.activation_checkpointing import activation_checkpointing_enabled
from leaf_plugins.rollout.prompt_embedding import (
    backbone_model_of,
    embed_prompts,
    head_on_positions,
    left_padded_positions,
    prompt_embeddings_in_front,
)
from leaf_plugins.training.selected_logprobs import selected_logprobs

__all__ = ["response_logprobs", "shares_prefix", "cache_keyword"]


def response_logprobs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    lengths: torch.Tensor,
    prompt_index: torch.Tensor,
    temperature: float = 1.0,
    shared_prefix: bool | None = None,
) -> torch.Tensor:
    """``[N, T]`` float32 log-probabilities of the response tokens under the policy
    distribution (logits / temperature), teacher forced, 0 on padding; differentiable.

    The prompts' embeddings (``inputs["inputs_embeds"]``, or computed here once per
    prompt) are shared by their responses; the output head runs on the ``T`` predicting
    positions only and the log-softmax is taken in chunks (``selected_logprobs``).

    :param inputs: the prompts' model inputs (left padded), one row per prompt.
    :param responses: ``[N, T]`` response token ids, ``-1`` on padding.
    :param prompt_index: ``[N]`` the prompt row of each response.
    :param shared_prefix: run each prompt once and its responses over its keys and
        values (True), every row over prompt and response (False), or decide
        (None: ``shares_prefix``).
    """
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    responses, lengths, prompt_index = responses.to(device), lengths.to(device), prompt_index.to(device)
    width = responses.shape[1]
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    tokens = torch.where(real, responses, 0)  # [N, T]
    if shared_prefix is None:
        shared_prefix = shares_prefix(model, rows=len(prompt_index), prompts=embeddings.shape[0])
    forced = _shared_prefix_pass if shared_prefix else _full_pass
    return torch.where(real, forced(model, inputs, embeddings, tokens, real, prompt_index, temperature), 0.0)


def shares_prefix(model: torch.nn.Module, rows: int, prompts: int) -> bool:
    """Whether the shared-prefix pass runs: it saves work (``rows > prompts``) and the
    model keeps its cache in this pass (transformers drops it where checkpointed layers
    record gradients; the no-grad reference pass runs them plainly, ``activation_checkpointing.py``)."""
    recomputing = (backbone_model_of(model).training and torch.is_grad_enabled()
                   and activation_checkpointing_enabled(model))
    return rows > prompts and not recomputing


def _full_pass(model: torch.nn.Module, inputs: dict[str, torch.Tensor], embeddings: torch.Tensor,
               tokens: torch.Tensor, real: torch.Tensor, prompt_index: torch.Tensor,
               temperature: float) -> torch.Tensor:
    """``[N, T]`` log π of ``tokens``, every row over its own prompt copy and response."""
    prompt_ids, prompt_mask = inputs["input_ids"][prompt_index], inputs["attention_mask"][prompt_index]  # [N, L]
    prompt_width, width = prompt_ids.shape[1], tokens.shape[1]
    ids = torch.cat([prompt_ids, tokens], dim=1)  # [N, L+T]; the prompt part is replaced by its embeddings
    mask = torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1)  # [N, L+T]
    positions = left_padded_positions(mask)  # [N, L+T]
    with prompt_embeddings_in_front(model, embeddings[prompt_index]), \
            head_on_positions(model, slice(prompt_width - 1, prompt_width + width - 1)):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [N, T, V]
    return selected_logprobs(logits, tokens, temperature)


def _shared_prefix_pass(model: torch.nn.Module, inputs: dict[str, torch.Tensor], embeddings: torch.Tensor,
                        tokens: torch.Tensor, real: torch.Tensor, prompt_index: torch.Tensor,
                        temperature: float) -> torch.Tensor:
    """``[N, T]`` log π of ``tokens``: each prompt once, its keys and values selected for
    its rows, then the responses' first ``T - 1`` tokens over them."""
    prompt_ids, prompt_mask = inputs["input_ids"], inputs["attention_mask"]  # [P, L]
    prompt_width, width = prompt_ids.shape[1], tokens.shape[1]
    prompt_positions = left_padded_positions(prompt_mask)  # [P, L]
    with prompt_embeddings_in_front(model, embeddings), head_on_positions(model, slice(prompt_width - 1, prompt_width)):
        prefix = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_positions, use_cache=True)
    first = selected_logprobs(prefix.logits[prompt_index], tokens[:, :1], temperature)  # [N, 1]
    if width == 1:
        return first
    keyword = cache_keyword(model)
    cache = getattr(prefix, keyword)
    cache.batch_select_indices(prompt_index)  # each layer's [P, H, L, d] keys and values → [N, H, L, d]
    mask = torch.cat([prompt_mask[prompt_index], real[:, :-1].to(prompt_mask.dtype)], dim=1)  # [N, L+T-1]
    positions = left_padded_positions(mask)[:, prompt_width:]  # [N, T-1]
    logits = model(input_ids=tokens[:, :-1], attention_mask=mask, position_ids=positions, use_cache=True,
                   **{keyword: cache}).logits  # [N, T-1, V]: the last token predicts nothing and is not run
    return torch.cat([first, selected_logprobs(logits, tokens[:, 1:], temperature)], dim=1)


def cache_keyword(model: torch.nn.Module) -> str:
    """The name under which the model's forward takes and returns its key/value cache:
    ``cache`` (transformers ≥ 5.2x) or ``past_key_values`` (the declared floor, 5.15)."""
    accepted = inspect.signature(backbone_model_of(model).forward).parameters
    return "cache" if "cache" in accepted else "past_key_values"
