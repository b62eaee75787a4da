"""The ``generate`` rollout backend: Hugging Face ``generate`` with sampling, the
per-token statistics taken by a logits processor (``TokenStatistics``). The reference
the static loop (``decoding/static_rollout.py``) is tested against."""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import LogitsProcessorList

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.core.stages import Rollout
from leaf_plugins.rollout.decoding.keyed_draw import response_keys
from leaf_plugins.rollout.prompt_embedding import embed_prompts, head_on_positions
from leaf_plugins.rollout.assembly import assemble_rollout, audio_token_ids
from leaf_plugins.rollout.token_stats import TokenStatistics

__all__ = ["generate_rollout", "sampling_seed"]


def sampling_seed(seed: int | None) -> int:
    """The rollout's sampling seed: ``seed``, or one drawn from torch's default generator
    when None (so a caller that seeded torch still gets a reproducible rollout)."""
    return int(torch.randint(0, 2**62, (1,))) if seed is None else int(seed)


@torch.no_grad()
def generate_rollout(
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
    sum_pi_squared: bool = True,
) -> Rollout:
    """Sample ``group_size`` responses for every prompt of ``inputs`` (left padded).

    The prompts are embedded once (``inputs["inputs_embeds"]`` when the caller already
    has them, see ``embed_prompts``) and the embeddings expanded to the K rows, so the
    audio encoder runs once per prompt. The per-token statistics are taken at each step
    (``TokenStatistics``): memory ``O(N·T)``, not ``O(N·T·V)``. Generation stops at EOS,
    which belongs to the response; what follows is padding. The tokens are drawn by
    ``keyed_draw.draw`` from the responses' keys (``seed``, the group ids, k): the same
    draws as the static loop's, whatever the batch. ``sum_pi_squared`` False: Σπ² is
    not computed (the batch's ``sum_pi_squared`` is None).
    """
    tokenizer = loaded.tokenizer
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    prompts = embeddings.shape[0]
    keys = response_keys(sampling_seed(seed), group_ids if group_ids is not None else range(prompts), group_size,
                         device)  # [N]
    statistics = TokenStatistics(temperature, top_p, audio_token_ids(loaded), device, keys, sum_pi_squared)
    with head_on_positions(model, slice(-1, None)):  # the prefill projects the last position only, not [N, L, V]
        generated = model.generate(
            inputs_embeds=embeddings.repeat_interleave(group_size, dim=0),  # [N, L, H]
            attention_mask=inputs["attention_mask"].repeat_interleave(group_size, dim=0),
            logits_processor=LogitsProcessorList([statistics]),
            do_sample=True,  # over TokenStatistics' one-hot scores: the token it drew
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
