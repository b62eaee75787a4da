"""A straightforward training step, kept only as the baseline that
``leaf bench step`` measures side by side with today's path and that the tests compare
values against. Not used in training.

* rollout with ``output_logits``: every step's ``[N, V]`` float32 logits and sampling
  scores (transformers' own suppression, temperature and top-p processors) kept, stacked
  to ``[N, T, V]`` and log-softmaxed; the token is drawn from the scores with the
  responses' keys (``keyed_draw``), as the rollout backends draw it;
* every response row carries its own copy of the prompt's audio features (the encoder
  runs K times per prompt in every pass);
* teacher forcing projects every position ``[N, P + T]`` onto the vocabulary and takes a
  float32 ``log_softmax`` over all of it;
* the loss is each micro-batch's own token mean, averaged over micro-batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
                          TopPLogitsWarper)

from leaf_plugins.core.backbone import LoadedBackbone
from leaf_plugins.core.stages import Rollout
from leaf_plugins.rollout.assembly import SURPRISAL_SOURCES, assemble_rollout, audio_token_ids
from leaf_plugins.rollout.decoding.keyed_draw import draw, response_keys
from leaf_plugins.rollout.generate import sampling_seed

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
    seed: int | None = None,
) -> Rollout:
    """Sample ``group_size`` responses for every prompt of ``inputs`` (left padded).

    Generation stops at EOS, which belongs to the response; what follows is padding.
    """
    if surprisal_from not in SURPRISAL_SOURCES:
        raise ValueError(f"surprisal_from must be one of {SURPRISAL_SOURCES}, got {surprisal_from!r}")
    tokenizer = loaded.tokenizer
    prompts = inputs["input_ids"].shape[0]
    keys = response_keys(sampling_seed(seed), group_ids if group_ids is not None else range(prompts), group_size,
                         inputs["input_ids"].device)  # [N]
    suppressed = audio_token_ids(loaded)
    choice = _KeyedChoice(keys)
    processors = [*([SuppressTokensLogitsProcessor(suppressed, device=keys.device)] if suppressed else []),
                  TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p), choice]
    output = model.generate(
        **inputs,
        logits_processor=LogitsProcessorList(processors),
        do_sample=True,
        temperature=1.0,  # the processors above apply them, before the keyed choice
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=group_size,
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
        sampling_scores = torch.stack(choice.scores, dim=1)  # after suppression, temperature and top-p
        surprisal = -_taken(torch.log_softmax(sampling_scores, dim=-1), generated)
    else:
        surprisal = -logprobs
    return assemble_rollout(tokenizer, generated, logprobs, surprisal, sum_pi_squared, policy_logits.shape[-1],
                            group_size, group_ids)


class _KeyedChoice(LogitsProcessor):
    """The last processor: keeps each step's ``[N, V]`` sampling scores, draws each row's
    token from them with its key and allows only that token."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys  # [N]
        self.scores: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.scores.append(scores.float())
        token = draw(torch.softmax(self.scores[-1], dim=-1), self.keys, len(self.scores) - 1)  # [N]
        return torch.full_like(scores, float("-inf")).scatter_(1, token.unsqueeze(1), 0.0)


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
