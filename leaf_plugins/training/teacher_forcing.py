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

The shared pass is used wherever the model can return its cache: not in a pass that
records gradients through checkpointed layers (``optim.activation_checkpointing``;
transformers drops the cache there), where the full pass runs. Left to decide by itself
(``shared_prefix=None``) it also runs only where it saves work (more rows than prompts).
The shared pass always makes two forward calls and the full pass one, whatever the
responses' widths: under FSDP2 every forward call gathers the sharded weights with the
other processes, so the calls a process makes must not depend on its data.

LoRA dropout is keyed (``keyed_dropout.py``) when the caller gives the rows' keys: each
forward call sets its tokens' keys, a prompt's positions keyed by the prompt alone, so
both passes drop the same units.
"""

from __future__ import annotations

import inspect

import torch

from leaf_plugins.training.activation_checkpointing import activation_checkpointing_enabled
from leaf_plugins.training.keyed_dropout import RowKeys, set_token_keys, token_keys
from leaf_plugins.rollout.prompt_embedding import (
    backbone_model_of,
    embed_prompts,
    head_on_positions,
    left_padded_positions,
    prompt_embeddings_in_front,
)
from leaf_plugins.training.selected_logprobs import selected_logprobs, selected_logprobs_and_entropy

__all__ = ["response_logprobs", "shares_prefix", "cache_keyword"]


def response_logprobs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    lengths: torch.Tensor,
    prompt_index: torch.Tensor,
    temperature: float = 1.0,
    shared_prefix: bool | None = None,
    dropout_keys: RowKeys | None = None,
    entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[N, T]`` float32 log-probabilities of the response tokens under the policy
    distribution (logits / temperature), teacher forced, 0 on padding; differentiable.
    With ``entropy``, also the ``[N, T]`` entropy of that distribution at each response
    position (0 on padding), differentiable too: ``(logprobs, entropy)``.

    The prompts' embeddings (``inputs["inputs_embeds"]``, or computed here once per
    prompt) are shared by their responses; the output head runs on the ``T`` predicting
    positions only and the log-softmax is taken in chunks (``selected_logprobs``).

    :param inputs: the prompts' model inputs (left padded), one row per prompt.
    :param responses: ``[N, T]`` response token ids, ``-1`` on padding.
    :param prompt_index: ``[N]`` the prompt row of each response.
    :param shared_prefix: run each prompt once and its responses over its keys and
        values (True, where the model keeps its cache: ``shares_prefix``), every row
        over prompt and response (False), or decide (None: the shared pass where it
        saves work and the model keeps its cache).
    :param dropout_keys: the keys of the prompts and responses, from which LoRA dropout
        draws its masks (``keyed_dropout.py``); None: torch's generator.
    """
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    responses, lengths, prompt_index = responses.to(device), lengths.to(device), prompt_index.to(device)
    width = responses.shape[1]
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    tokens = torch.where(real, responses, 0)  # [N, T]
    if shared_prefix is None:
        shared_prefix = len(prompt_index) > embeddings.shape[0]
    forced = _shared_prefix_pass if shared_prefix and shares_prefix(model) else _full_pass
    logprobs, entropies = forced(model, inputs, embeddings, tokens, real, prompt_index,
                                 _Heads(temperature, entropy), dropout_keys)
    if not entropy:
        return torch.where(real, logprobs, 0.0)
    return torch.where(real, logprobs, 0.0), torch.where(real, entropies, 0.0)


class _Heads:
    """What a pass takes of its logits: the chosen tokens' log-probabilities at
    ``temperature``, and their distributions' entropies where ``entropy`` is asked for."""

    def __init__(self, temperature: float, entropy: bool) -> None:
        self.temperature, self.entropy = temperature, entropy

    def __call__(self, logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.entropy:
            return selected_logprobs_and_entropy(logits, tokens, self.temperature)  # [N, W] each
        return selected_logprobs(logits, tokens, self.temperature), None


def shares_prefix(model: torch.nn.Module) -> bool:
    """Whether the shared-prefix pass can run: the model keeps its cache in this pass
    (transformers drops it where checkpointed layers record gradients; the no-grad
    reference pass runs them plainly, ``activation_checkpointing.py``)."""
    return not (backbone_model_of(model).training and torch.is_grad_enabled()
                and activation_checkpointing_enabled(model))


def _full_pass(model: torch.nn.Module, inputs: dict[str, torch.Tensor], embeddings: torch.Tensor,
               tokens: torch.Tensor, real: torch.Tensor, prompt_index: torch.Tensor,
               heads: _Heads, dropout_keys: RowKeys | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N, T]`` log π of ``tokens`` (and entropies, where asked), every row over its own
    prompt copy and response."""
    prompt_ids, prompt_mask = inputs["input_ids"][prompt_index], inputs["attention_mask"][prompt_index]  # [N, L]
    prompt_width, width = prompt_ids.shape[1], tokens.shape[1]
    ids = torch.cat([prompt_ids, tokens], dim=1)  # [N, L+T]; the prompt part is replaced by its embeddings
    mask = torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1)  # [N, L+T]
    positions = left_padded_positions(mask)  # [N, L+T]
    set_token_keys(None if dropout_keys is None else torch.cat([
        token_keys(dropout_keys.prompts[prompt_index.cpu()], positions[:, :prompt_width]),
        token_keys(dropout_keys.responses, positions[:, prompt_width:])], dim=1))  # [N, L+T]
    with prompt_embeddings_in_front(model, embeddings[prompt_index]), \
            head_on_positions(model, slice(prompt_width - 1, prompt_width + width - 1)):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [N, T, V]
    return heads(logits, tokens)


def _shared_prefix_pass(model: torch.nn.Module, inputs: dict[str, torch.Tensor], embeddings: torch.Tensor,
                        tokens: torch.Tensor, real: torch.Tensor, prompt_index: torch.Tensor,
                        heads: _Heads, dropout_keys: RowKeys | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N, T]`` log π of ``tokens`` (and entropies, where asked): each prompt once, its
    keys and values selected for its rows, then the responses' first ``T - 1`` tokens
    over them. Responses one token wide get a padding column, so that the second forward
    call runs as on every process."""
    width = tokens.shape[1]
    if width == 1:
        tokens = torch.cat([tokens, torch.zeros_like(tokens)], dim=1)  # [N, 2]
        real = torch.cat([real, torch.zeros_like(real)], dim=1)
    prompt_ids, prompt_mask = inputs["input_ids"], inputs["attention_mask"]  # [P, L]
    prompt_width = prompt_ids.shape[1]
    prompt_positions = left_padded_positions(prompt_mask)  # [P, L]
    set_token_keys(None if dropout_keys is None else token_keys(dropout_keys.prompts, prompt_positions))  # [P, L]
    with prompt_embeddings_in_front(model, embeddings), head_on_positions(model, slice(prompt_width - 1, prompt_width)):
        prefix = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_positions, use_cache=True)
    first, first_entropy = heads(prefix.logits[prompt_index], tokens[:, :1])  # [N, 1]
    keyword = cache_keyword(model)
    cache = getattr(prefix, keyword)
    cache.batch_select_indices(prompt_index)  # each layer's [P, H, L, d] keys and values → [N, H, L, d]
    mask = torch.cat([prompt_mask[prompt_index], real[:, :-1].to(prompt_mask.dtype)], dim=1)  # [N, L+T-1]
    positions = left_padded_positions(mask)[:, prompt_width:]  # [N, T-1]
    set_token_keys(None if dropout_keys is None else token_keys(dropout_keys.responses, positions))  # [N, T-1]
    logits = model(input_ids=tokens[:, :-1], attention_mask=mask, position_ids=positions, use_cache=True,
                   **{keyword: cache}).logits  # [N, T-1, V]: the last token predicts nothing and is not run
    rest, rest_entropy = heads(logits, tokens[:, 1:])  # [N, T-1]
    logprobs = torch.cat([first, rest], dim=1)[:, :width]
    return logprobs, None if rest_entropy is None else torch.cat([first_entropy, rest_entropy], dim=1)[:, :width]


def cache_keyword(model: torch.nn.Module) -> str:
    """The name under which the model's forward takes and returns its key/value cache:
    ``cache`` (transformers ≥ 5.2x) or ``past_key_values`` (the declared floor, 5.15)."""
    accepted = inspect.signature(backbone_model_of(model).forward).parameters
    return "cache" if "cache" in accepted else "past_key_values"
