"""The ``static`` rollout backend: prefill once per prompt, then a decode loop over
static buffers, producing the same ``Rollout`` as the ``generate`` backend.

1. The prompts' embeddings (audio merged in, once per prompt) run through the decoder
   once (``LeanDecoder.prefill``); their keys and values are kept once per prompt
   (``KVBuffers``) and the last position's logits give every row's first sample.
2. Each decode step feeds every row's last sample, attends over its prompt's keys and
   values and its own, and samples the next token (``SamplingStep``): no host
   synchronisation. On CUDA the step is captured once as a CUDA graph and replayed
   (``GraphedStep``): the prompts' width is rounded up to a multiple of
   ``WIDTH_BUCKET`` (more left padding), and the capture, its buffers and its state are
   kept per model and shape (``CAPTURES_PER_MODEL`` of them, the last used) and reused
   by later rollouts of that shape, which only reset the buffers in place. The first
   replay of a capture is checked against the eager step (``GraphedStep``'s
   self-check); on a mismatch or a capture error the rollout, and every later one of
   that model, falls back to Hugging Face ``generate`` with one warning saying why. The
   model runs in eval mode throughout (no dropout) and is put back as it was. On the
   CPU the step runs eagerly.
   Each layer's LoRA-folded projections, concatenated per input
   (``projections.fused_linear``), replace the adapted projections where
   ``folds_by_default`` says so: on the CPU for models small enough that a step is
   per-operator overhead (28% fewer operators per step), on CUDA where the folded copy
   fits in free device memory (peft's float32 adapter is six small kernels per
   projection, about a third of an 8B model's step). The copy is written once per
   rollout from the current weights (``LeanDecoder.refold``) and shared by a model's
   kept captures; the base weights are only read.
3. Whether every row has finished is checked once per ``check_every`` steps on CUDA (one
   synchronisation per chunk; up to ``check_every - 1`` steps may run past the last EOS,
   their samples are padding) and after every step on the CPU, where checking costs
   nothing. The output is cut to the longest response, as ``generate`` returns it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import torch

from leaf_plugins.core.stages import Rollout, RolloutRequest
from leaf_plugins.rollout.decoding.cuda_graph import Capture, GraphedStep, GraphUnusable, cuda_capture
from leaf_plugins.rollout.decoding.decode_state import DecodeState
from leaf_plugins.rollout.decoding.family import DecoderFamily, decoder_family
from leaf_plugins.rollout.decoding.keyed_draw import response_keys
from leaf_plugins.rollout.decoding.kv_buffers import KVBuffers
from leaf_plugins.rollout.decoding.lean_decoder import LeanDecoder, fold_bytes
from leaf_plugins.rollout.decoding.phase_timer import PhaseTimer
from leaf_plugins.rollout.decoding.sampling_step import SamplingStep
from leaf_plugins.rollout.generate import generate_rollout, sampling_seed
from leaf_plugins.rollout.generation_weights import gathered_for_generation
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.rollout.assembly import assemble_rollout, audio_token_ids, response_lengths

__all__ = ["static_rollout", "CUDA_CHECK_EVERY", "FOLD_LIMIT_BYTES", "FOLD_MARGIN_FRACTION", "WIDTH_BUCKET",
           "CAPTURES_PER_MODEL", "folds_by_default", "graph_failure", "release_captures", "static_folds"]

CUDA_CHECK_EVERY = 8
"""Decode steps between two checks of "has every row finished?" on CUDA."""

FOLD_LIMIT_BYTES = 1 << 30
"""Largest decoder (its layers' parameters, in bytes) whose projections the CPU loop
folds by default: the folded copy costs as much memory again, which is small next to
the time it saves only where the layers are small (at 1 GiB a step is dominated by
reading the weights, not by the number of operators)."""

FOLD_MARGIN_FRACTION = 0.25
"""Share of the device's memory that must stay free after the folded copy is made
before CUDA folds by default: the copy is kept with the model's captures between
rollouts, so the rollout's own buffers (its K/V cache, prefill activations and graph:
up to 4 GB above the model at 48 rows on the 8B backbones), the teacher-forced pass and
the training step that follow must still fit beside it."""

WIDTH_BUCKET = 64
"""The captured loop's prompt width is rounded up to a multiple of this (left padding),
so prompts of nearby lengths share one capture."""

CAPTURES_PER_MODEL = 2
"""Captures (each with its K/V buffers) kept per model, the most recently used; an
older shape is captured again when it comes back."""


@dataclass
class _Captured:
    """One model's decode step captured at one shape, with everything it reads and writes."""

    decoder: LeanDecoder
    sampler: SamplingStep
    buffers: KVBuffers
    state: DecodeState
    graphed: GraphedStep


_captures: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple, _Captured]]" = weakref.WeakKeyDictionary()
_failures: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
_fold_notices: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def graph_failure(model: torch.nn.Module) -> str | None:
    """Why ``model``'s rollouts fell back to ``generate`` (its captured step failed the
    self-check or could not be captured), or None."""
    return _failures.get(model)


def static_folds(model: torch.nn.Module) -> bool | None:
    """Whether ``model``'s kept captures run folded projections (``LeanDecoder.folded``);
    None when it has none."""
    kept = _captures.get(model)
    return any(entry.decoder.folded for entry in kept.values()) if kept else None


def release_captures(model: torch.nn.Module) -> None:
    """Drop ``model``'s kept captures and their buffers (their memory returns to the
    allocator) and forget a recorded fallback, so the next rollout captures afresh."""
    _captures.pop(model, None)
    _failures.pop(model, None)


def _device_memory(device: torch.device) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``: free counts the driver's free memory and
    what the caching allocator holds unused (it serves new tensors from it)."""
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def folds_by_default(family: DecoderFamily, device: torch.device) -> bool:
    """Whether ``static_rollout`` folds the projections when not told.

    - CPU: for a float32 decoder of at most ``FOLD_LIMIT_BYTES``, where a step is
      per-operator overhead. Not in bf16 or fp16 on the CPU: there the fold's one
      rounding of ``W + s·B A`` to 8 bits of mantissa moves log π away from the
      teacher-forced pass's (tiny backbones in bf16: mean |Δ log π| 0.023-0.043 folded
      against 0.016-0.026 not) for little time saved.
    - CUDA: when the folded copy (``lean_decoder.fold_bytes``: the kept copy and the
      largest float32 sum made while folding) leaves ``FOLD_MARGIN_FRACTION`` of the
      device's memory free. Otherwise the projections run unfolded, with one warning
      per model saying so. In bf16 the folded weights carry that same rounding; the
      rollout-against-teacher-forcing mismatch it leaves is measured by ``leaf bench
      rollout`` (``docs/rollout.md``).
    """
    if device.type == "cuda":
        kept, transient = fold_bytes(family)
        if kept == 0:
            return False
        free, total = _device_memory(device)
        margin = int(FOLD_MARGIN_FRACTION * total)
        if kept + transient + margin <= free:
            return True
        if family.decoder not in _fold_notices:
            _fold_notices.add(family.decoder)
            warnings.warn(f"rollout.backend=static: the LoRA-folded projections need {kept / 2**30:.2f} GiB "
                          f"(+{transient / 2**30:.2f} GiB while folding) and {margin / 2**30:.2f} GiB must stay free, "
                          f"but {free / 2**30:.2f} GiB are free on {device}; the projections run unfolded (slower)",
                          stacklevel=3)
        return False
    parameters = [parameter for layer in family.layers for parameter in layer.parameters()]
    if device.type != "cpu" or any(parameter.dtype != torch.float32 for parameter in parameters):
        return False
    return sum(parameter.numel() * parameter.element_size() for parameter in parameters) <= FOLD_LIMIT_BYTES


@contextlib.contextmanager
def _evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside (no dropout in the sampled or captured step), each
    module's mode put back on exit."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _weights_key(model: torch.nn.Module) -> tuple:
    """What a capture depends on beyond shapes: every parameter's address (a capture
    reads the weights where they were) and each LoRA layer's adapter state."""
    addresses = tuple(parameter.data_ptr() for parameter in model.parameters())
    adapters = tuple((bool(module.disable_adapters), bool(module.merged), tuple(module.active_adapters))
                     for module in model.modules() if hasattr(module, "lora_A") and hasattr(module, "merged"))
    return addresses, adapters


def _bucketed(embeddings: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts left padded to a multiple of ``WIDTH_BUCKET`` positions."""
    prompts, width, hidden = embeddings.shape
    extra = -width % WIDTH_BUCKET
    if extra == 0:
        return embeddings, mask
    return (torch.cat([embeddings.new_zeros(prompts, extra, hidden), embeddings], dim=1),
            torch.cat([mask.new_zeros(prompts, extra), mask], dim=1))


def _new_decoder(family: DecoderFamily, model: torch.nn.Module, weights: tuple, fold: bool | None,
                 device: torch.device) -> LeanDecoder:
    """A decoder for a rollout without a kept capture: one sharing the folded copy of a
    kept capture with the same weights (written again from them) when folding, else a
    new one (``fold``, or ``folds_by_default``)."""
    if fold is not False:
        for entry_key, entry in _captures.get(model, {}).items():
            if entry_key[-1] == weights and entry.decoder.folded:
                decoder = LeanDecoder(family, sharing=entry.decoder)
                decoder.refold()
                return decoder
    return LeanDecoder(family, folds_by_default(family, device) if fold is None else fold)


@torch.no_grad()
def static_rollout(request: RolloutRequest, cuda_graph: bool = True, fold: bool | None = None,
                   capture: Capture | None = None, timer: PhaseTimer | None = None) -> Rollout:
    """Sample ``request.group_size`` responses for every prompt of ``request.inputs``
    (left padded) with the static decode loop; result as ``sample_responses``.

    :param cuda_graph: on CUDA, capture the decode step once and replay it (False: run
        it eagerly, e.g. to profile it).
    :param fold: run the layers' folded, concatenated projections (``LeanDecoder``);
        None: ``folds_by_default``.
    :param capture: how the step is recorded (``cuda_graph.cuda_capture`` on CUDA, the
        default); given on the CPU (``cuda_graph.eager_capture``), the CPU runs the
        captured path: the static span, the reuse across rollouts and the self-check.
    :param timer: marks the end of the prefill, of the capture (when this rollout
        captures) and of the decode loop.
    :raises TypeError: the model is not one the loop supports (``family.decoder_family``).
    """
    model = request.model
    seed = sampling_seed(request.seed)
    keyed = dataclasses.replace(request, seed=seed)  # a fallback to generate draws what the loop would have drawn
    if model in _failures:
        return generate_rollout(keyed)
    family = decoder_family(model)
    try:
        with _evaluating(model):
            return _sample(family, request, seed, cuda_graph, fold, capture, timer)
    except GraphUnusable as error:
        _failures[model] = str(error)
        _captures.pop(model, None)
        warnings.warn(f"rollout.backend=static: {error}; this and later rollouts of this model use Hugging Face "
                      "generate (rollout.backend=generate) instead", stacklevel=2)
        return generate_rollout(keyed)


def _sample(family: DecoderFamily, request: RolloutRequest, seed: int, cuda_graph: bool, fold: bool | None,
            capture: Capture | None, timer: PhaseTimer | None) -> Rollout:
    """``static_rollout``'s loop, drawing from the keys of ``seed`` (``request.seed``
    resolved)."""
    model, loaded, inputs, group_size = request.model, request.loaded, request.inputs, request.group_size
    max_new_tokens, temperature, top_p = request.max_new_tokens, request.temperature, request.top_p
    group_ids, sum_pi_squared = request.group_ids, request.computes("sum_pi_squared")
    tokenizer = loaded.tokenizer
    embeddings = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed_prompts(model, inputs)  # [P, L, H]
    device = embeddings.device
    mask = inputs["attention_mask"].to(device)  # [P, L]
    graph_capture = capture or (cuda_capture if device.type == "cuda" and cuda_graph else None)
    if graph_capture is not None:
        embeddings, mask = _bucketed(embeddings, mask)
    prompts, width = mask.shape
    rows, slots = prompts * group_size, max_new_tokens - 1  # the last sample is never fed back
    banned = tuple(audio_token_ids(loaded))
    if timer is not None:
        timer.mark("start")
    with gathered_for_generation(model):  # FSDP2: the loop calls submodules directly, so they must hold full weights
        weights = _weights_key(model)
        key = (prompts, width, rows, max_new_tokens, embeddings.dtype, device, temperature, top_p, banned,
               tokenizer.eos_token_id, tokenizer.pad_token_id, sum_pi_squared, weights) if graph_capture else None
        kept = _captures.setdefault(model, OrderedDict()) if graph_capture else None
        captured = kept.pop(key, None) if kept is not None else None
        if kept is not None and captured is None:
            for stale in [entry for entry in kept if entry[-1] != weights]:  # weights moved: unusable, free them
                del kept[stale]
        if captured is not None:
            decoder = captured.decoder
            decoder.refold()  # the weights may have been updated in place since the last rollout
        else:
            decoder = _new_decoder(family, model, weights, fold, device)
            decoder.prepare_positions(width + max_new_tokens, embeddings)
        logits, cached_keys, values = decoder.prefill(embeddings, mask)  # [P, V]
        prompt_lengths = mask.sum(dim=1).repeat_interleave(group_size)  # [N]
        keys = response_keys(seed, group_ids if group_ids is not None else range(prompts), group_size, device)  # [N]
        if captured is None:
            buffers = KVBuffers.around(cached_keys, values, mask, rows, slots)
            state = DecodeState.start(prompt_lengths, max_new_tokens, tokenizer.pad_token_id, keys)
            sampler = SamplingStep(temperature, top_p, banned, logits.shape[-1], tokenizer.eos_token_id,
                                   tokenizer.pad_token_id, device, sum_pi_squared)
        else:
            buffers, state, sampler = captured.buffers, captured.state, captured.sampler
            buffers.load(cached_keys, values, mask)
            state.restart(prompt_lengths, tokenizer.pad_token_id, keys)
        del cached_keys, values
        sampler(logits.repeat_interleave(group_size, dim=0), state)  # every row's first sample
        if timer is not None:
            timer.mark("prefill")

        def decode(span: int, masked: torch.Tensor | None) -> None:
            sampler(decoder.step(state.tokens, state.positions, state.column - 1, span, buffers, masked), state)

        graphed = captured.graphed if captured else None
        if graph_capture is not None and graphed is None:
            span_positions = torch.arange(max(slots, 1), device=device)
            graphed = GraphedStep(lambda: decode(slots, span_positions), state, graph_capture)
        if kept is not None:
            kept[key] = _Captured(decoder, sampler, buffers, state, graphed)  # the most recent last
            while len(kept) > CAPTURES_PER_MODEL:
                kept.popitem(last=False)
        check_every = CUDA_CHECK_EVERY if device.type == "cuda" else 1
        steps_after_capture = 0
        for step in range(slots):  # decode step `step` feeds slot `step` and samples column `step + 1`
            if step % check_every == 0 and bool(state.finished.all()):
                break
            if graphed is not None:
                was_captured = graphed.captured
                graphed()  # attends over every slot, the unwritten ones masked: one static shape
                if was_captured:
                    steps_after_capture += 1
                elif graphed.captured and timer is not None:
                    timer.mark("capture")
            else:
                decode(step + 1, None)  # eagerly: over the written slots only
                steps_after_capture += 1
        if timer is not None:
            timer.mark("decode")
            timer.decode_steps = steps_after_capture
    cut = slice(0, int(response_lengths(state.generated, tokenizer.eos_token_id).max()))  # generate's width
    surprisal = -state.sampling_logprobs if request.surprisal_from == "sampling" else -state.logprobs
    return assemble_rollout(tokenizer, state.generated[:, cut], state.logprobs[:, cut], surprisal[:, cut],
                            state.sum_pi_squared[:, cut] if sum_pi_squared else None, logits.shape[-1], group_size,
                            group_ids)
