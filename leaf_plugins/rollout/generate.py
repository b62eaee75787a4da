"""The ``generate`` rollout backend: Hugging Face ``generate`` with sampling, the
per-token statistics taken by a logits processor (``TokenStatistics``). The reference
the static loop (``decoding/static_rollout.py``) is tested against."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from leaf_plugins.core.stages import Rollout, RolloutRequest
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
def generate_rollout(request: RolloutRequest) -> Rollout:
    """Sample ``request.group_size`` responses for every prompt of ``request.inputs``
    (left padded).

    The prompts are embedded once (``inputs["inputs_embeds"]`` when the caller already
    has them, see ``embed_prompts``) and the embeddings expanded to the K rows, so the
    audio encoder runs once per prompt. The per-token statistics are taken at each step
    (``TokenStatistics``): memory ``O(N·T)``, not ``O(N·T·V)``. Generation stops at EOS,
    which belongs to the response; what follows is padding. The tokens are drawn by
    ``keyed_draw.draw`` from the responses' keys (``request.seed``, the group ids, k):
    the same draws as the static loop's, whatever the batch. Σπ² is computed only where
    ``request.computes("sum_pi_squared")`` (else the batch's ``sum_pi_squared`` is None).
    """
    model, inputs, group_size, group_ids = request.model, request.inputs, request.group_size, request.group_ids
    tokenizer = request.loaded.tokenizer
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    prompts = embeddings.shape[0]
    keys = response_keys(sampling_seed(request.seed), group_ids if group_ids is not None else range(prompts),
                         group_size, device)  # [N]
    statistics = TokenStatistics(request.temperature, request.top_p, audio_token_ids(request.loaded), device, keys,
                                 request.computes("sum_pi_squared"))
    with head_on_positions(model, slice(-1, None)):  # the prefill projects the last position only, not [N, L, V]
        generated = model.generate(
            inputs_embeds=embeddings.repeat_interleave(group_size, dim=0),  # [N, L, H]
            attention_mask=inputs["attention_mask"].repeat_interleave(group_size, dim=0),
            logits_processor=LogitsProcessorList([statistics]),
            do_sample=True,  # over TokenStatistics' one-hot scores: the token it drew
            temperature=1.0,  # TokenStatistics applies the temperature, top-p and the audio-token ban
            top_p=1.0,
            top_k=0,
            max_new_tokens=request.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # [N, T]: with inputs_embeds only, generate returns the new tokens alone
    recorded = statistics.finish(generated[:, -1])  # [N, T] each
    surprisal = -recorded["sampling_logprobs"] if request.surprisal_from == "sampling" else -recorded["logprobs"]
    return assemble_rollout(tokenizer, generated, recorded["logprobs"], surprisal, recorded["sum_pi_squared"],
                            statistics.vocab_size, group_size, group_ids)
