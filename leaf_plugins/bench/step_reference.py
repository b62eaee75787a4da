"""A straightforward training step, kept only as the baseline that
``leaf bench step`` measures side by side with today's path and that the tests compare
values against. Not used in training.

* rollout with ``output_scores`` and ``output_logits``: every step's ``[N, V]`` float32
  logits and scores kept, stacked to ``[N, T, V]`` and log-softmaxed;
* every response row carries its own copy of the prompt's audio features (the encoder
  runs K times per prompt in every pass);
* teacher forcing projects every position ``[N, P + T]`` onto the vocabulary and takes a
  float32 ``log_softmax`` over all of it;
* the loss is each micro-batch's own token mean, averaged over micro-batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.training.rollout import SURPRISAL_SOURCES, Rollout, assemble_rollout, audio_token_ids

__all__ = ["sample_responses_k_copies", "response_logprobs_full_vocabulary"]


@torch.no_grad()
def sample_responses_k_copies(
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

    Generation stops at EOS, which belongs to the response; what follows is padding.
    """
    if surprisal_from not in SURPRISAL_SOURCES:
        raise ValueError(f"surprisal_from must be one of {SURPRISAL_SOURCES}, got {surprisal_from!r}")
    tokenizer = loaded.tokenizer
    output = model.generate(
        **inputs,
        suppress_tokens=audio_token_ids(loaded) or None,
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=group_size,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    prompt_width = inputs["input_ids"].shape[1]
    generated = output.sequences[:, prompt_width:]  # [N, T]
    policy_logits = torch.stack(output.logits, dim=1).float() / temperature  # [N, T, V]
    policy_log_probabilities = torch.log_softmax(policy_logits, dim=-1)  # [N, T, V]
    logprobs = _taken(policy_log_probabilities, generated)  # [N, T]
    sum_pi_squared = policy_log_probabilities.mul(2).exp_().sum(dim=-1)  # [N, T]: Σ_v π(v)²
    if surprisal_from == "sampling":
        sampling_scores = torch.stack(output.scores, dim=1).float()  # after temperature and top-p
        surprisal = -_taken(torch.log_softmax(sampling_scores, dim=-1), generated)
    else:
        surprisal = -logprobs
    return assemble_rollout(tokenizer, generated, logprobs, surprisal, sum_pi_squared, policy_logits.shape[-1],
                            group_size, group_ids)


def response_logprobs_full_vocabulary(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    responses: torch.Tensor,
    lengths: torch.Tensor,
    prompt_index: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``[N, T]`` float32 log-probabilities of the response tokens under the policy
    distribution (logits / temperature), teacher forced, 0 on padding; differentiable.

    :param inputs: the prompts' model inputs (left padded), one row per prompt.
    :param responses: ``[N, T]`` response token ids, ``-1`` on padding.
    :param prompt_index: ``[N]`` the prompt row of each response.
    """
    device = inputs["input_ids"].device
    responses, lengths, prompt_index = responses.to(device), lengths.to(device), prompt_index.to(device)
    width = responses.shape[1]
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    prompt_ids = inputs["input_ids"][prompt_index]  # [N, P]
    prompt_mask = inputs["attention_mask"][prompt_index]  # [N, P]
    ids = torch.cat([prompt_ids, torch.where(real, responses, 0)], dim=1)  # [N, P+T]
    mask = torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # as generate computes them for left padding
    extra: dict[str, Any] = {
        key: value[prompt_index] for key, value in inputs.items() if key not in ("input_ids", "attention_mask")
    }
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **extra).logits  # [N, P+T, V]
    predicting = logits[:, prompt_ids.shape[1] - 1 : -1].float() / temperature  # [N, T, V]
    taken = _taken(torch.log_softmax(predicting, dim=-1), torch.where(real, responses, 0))
    return torch.where(real, taken, 0.0)


def _taken(log_probabilities: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` log-probability of each token from ``[N, T, V]``."""
    return log_probabilities.gather(2, tokens.unsqueeze(2)).squeeze(2)
