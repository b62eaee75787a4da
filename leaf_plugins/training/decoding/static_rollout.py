"""The ``static`` rollout backend: prefill once per prompt, then a decode loop over
static buffers, producing the same ``Rollout`` as the ``generate`` backend.

1. The prompts' embeddings (audio merged in, once per prompt) run through the decoder
   once (``LeanDecoder.prefill``); their keys and values are kept once per prompt
   (``KVBuffers``) and the last position's logits give every row's first sample.
2. Each decode step feeds every row's last sample, attends over its prompt's keys and
   values and its own, and samples the next token (``SamplingStep``): no host
   synchronisation. On CUDA the step is captured once as a CUDA graph and replayed
   (``GraphedStep``); on the CPU it runs eagerly, and for models small enough that a
   step is per-operator overhead (decoder weights up to ``FOLD_LIMIT_BYTES``) each
   layer's LoRA-folded projections are computed once per rollout and concatenated per
   input (``projections.fused_linear``): 28% fewer operators per step.
3. Whether every row has finished is checked once per ``check_every`` steps on CUDA (one
   synchronisation per chunk; up to ``check_every - 1`` steps may run past the last EOS,
   their samples are padding) and after every step on the CPU, where checking costs
   nothing. The output is cut to the longest response, as ``generate`` returns it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.core.stages import Rollout
from leaf_plugins.training.decoding.cuda_graph import GraphedStep
from leaf_plugins.training.decoding.decode_state import DecodeState
from leaf_plugins.training.decoding.family import DecoderFamily, decoder_family
from leaf_plugins.training.decoding.kv_buffers import KVBuffers
from leaf_plugins.training.decoding.lean_decoder import LeanDecoder
from leaf_plugins.training.decoding.sampling_step import SamplingStep
from leaf_plugins.training.generation_weights import gathered_for_generation
from leaf_plugins.training.prompt_embedding import embed_prompts
from leaf_plugins.training.rollout_assembly import assemble_rollout, audio_token_ids, response_lengths

__all__ = ["static_rollout", "CUDA_CHECK_EVERY", "FOLD_LIMIT_BYTES", "folds_by_default"]

CUDA_CHECK_EVERY = 8
"""Decode steps between two checks of "has every row finished?" on CUDA."""

FOLD_LIMIT_BYTES = 1 << 30
"""Largest decoder (its layers' parameters, in bytes) whose projections the CPU loop
folds by default: the folded copy costs as much memory again, which is small next to
the time it saves only where the layers are small (at 1 GiB a step is dominated by
reading the weights, not by the number of operators)."""


def folds_by_default(family: DecoderFamily, device: torch.device) -> bool:
    """Whether ``static_rollout`` folds the projections when not told: on the CPU, for a
    float32 decoder of at most ``FOLD_LIMIT_BYTES``. Never on CUDA, where the step is a
    graph replay (no per-operator host cost) and a copy of a 7-8B model's layers would
    not fit; never in bf16 or fp16, where the folded weights' one rounding to 8 bits of
    mantissa moves log π away from the teacher-forced pass's (on the tiny backbones in
    bf16: mean |Δ log π| 0.023-0.043 folded against 0.016-0.026 not; ``leaf bench
    rollout``)."""
    parameters = [parameter for layer in family.layers for parameter in layer.parameters()]
    if device.type != "cpu" or any(parameter.dtype != torch.float32 for parameter in parameters):
        return False
    return sum(parameter.numel() * parameter.element_size() for parameter in parameters) <= FOLD_LIMIT_BYTES


@torch.no_grad()
def static_rollout(
    model: torch.nn.Module,
    loaded: LoadedBackbone,
    inputs: dict[str, torch.Tensor],
    group_size: int,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_p: float = 0.9,
    surprisal_from: str = "sampling",
    group_ids: Sequence[int] | None = None,
    cuda_graph: bool = True,
    fold: bool | None = None,
) -> Rollout:
    """Sample ``group_size`` responses for every prompt of ``inputs`` (left padded) with
    the static decode loop; arguments and result as ``sample_responses``.

    :param cuda_graph: on CUDA, capture the decode step once and replay it (False: run
        it eagerly, e.g. to profile it).
    :param fold: run the layers' folded, concatenated projections (``LeanDecoder``);
        None: ``folds_by_default``.
    :raises TypeError: the model is not one the loop supports (``family.decoder_family``).
    """
    family = decoder_family(model)
    tokenizer = loaded.tokenizer
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    mask = inputs["attention_mask"].to(device)  # [P, L]
    prompts, width = mask.shape
    rows, slots = prompts * group_size, max_new_tokens - 1  # the last sample is never fed back
    with gathered_for_generation(model):  # FSDP2: the loop calls submodules directly, so they must hold full weights
        decoder = LeanDecoder(family, folds_by_default(family, device) if fold is None else fold)
        decoder.prepare_positions(width + max_new_tokens, embeddings)
        logits, keys, values = decoder.prefill(embeddings, mask)  # [P, V]
        buffers = KVBuffers.around(keys, values, mask, rows, slots)
        state = DecodeState.start(mask.sum(dim=1).repeat_interleave(group_size), max_new_tokens, tokenizer.pad_token_id)
        sampler = SamplingStep(temperature, top_p, audio_token_ids(loaded), logits.shape[-1], tokenizer.eos_token_id,
                               tokenizer.pad_token_id, device)
        sampler(logits.repeat_interleave(group_size, dim=0), state)  # every row's first sample
        span_positions = torch.arange(max(slots, 1), device=device)

        def decode(span: int, masked: torch.Tensor | None) -> None:
            sampler(decoder.step(state.tokens, state.positions, state.column - 1, span, buffers, masked), state)

        on_cuda = device.type == "cuda"
        graphed = GraphedStep(lambda: decode(slots, span_positions)) if on_cuda and cuda_graph else None
        check_every = CUDA_CHECK_EVERY if on_cuda else 1
        for step in range(slots):  # decode step `step` feeds slot `step` and samples column `step + 1`
            if step % check_every == 0 and bool(state.finished.all()):
                break
            if graphed is not None:
                graphed()  # attends over every slot, the unwritten ones masked: one static shape
            else:
                decode(step + 1, None)  # eagerly: over the written slots only
    cut = slice(0, int(response_lengths(state.generated, tokenizer.eos_token_id).max()))  # generate's width
    surprisal = -state.sampling_logprobs if surprisal_from == "sampling" else -state.logprobs
    return assemble_rollout(tokenizer, state.generated[:, cut], state.logprobs[:, cut], surprisal[:, cut],
                            state.sum_pi_squared[:, cut], logits.shape[-1], group_size, group_ids)

