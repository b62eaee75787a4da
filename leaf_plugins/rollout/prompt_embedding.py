"""Prompts embedded once, audio included, and shared by their K responses.

A speech LLM turns a prompt into the language model's input embeddings by running the
(frozen) audio encoder and projector and scattering their outputs into the audio slots.
Giving each of the K response rows its own copy of the audio features runs the encoder
K times per pass. ``embed_prompts`` runs the model's own merging code once per prompt
and stops it at the language model's door, so the result is exactly what the model
would have fed its language model; the rollout and the teacher-forced passes then expand
these ``[P, L, H]`` embeddings to their rows.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

__all__ = ["embed_prompts", "prompt_embeddings_in_front", "language_model_of", "backbone_model_of", "head_on_positions",
           "left_padded_positions", "with_prompt_embeddings"]

AUDIO_INPUTS = ("input_features", "feature_attention_mask", "input_features_mask")
"""Model inputs that only the audio encoder reads (the families' names)."""


class _Captured(Exception):
    """Raised by the language model's pre-hook to stop the forward pass there."""

    def __init__(self, embeddings: torch.Tensor) -> None:
        super().__init__("prompt embeddings captured")
        self.embeddings = embeddings


def backbone_model_of(model: Any) -> torch.nn.Module:
    """The transformers model inside DDP/FSDP and peft wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def language_model_of(model: Any) -> torch.nn.Module:
    """The decoder stack that reads ``inputs_embeds`` (``model.language_model`` in both
    built-in families)."""
    inner = backbone_model_of(model)
    found = getattr(getattr(inner, "model", None), "language_model", None) or getattr(inner, "language_model", None)
    if found is None:
        raise TypeError(f"{type(inner).__name__} has no language_model submodule: cannot share prompt embeddings")
    return found


def left_padded_positions(mask: torch.Tensor) -> torch.Tensor:
    """``[R, W]`` position ids of left-padded rows from their ``[R, W]`` attention mask,
    as ``generate`` computes them: ``cumsum(mask) - 1``, 0 on the padding."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


@torch.no_grad()
def embed_prompts(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[P, L, H]`` input embeddings of the (left padded) prompts in ``inputs``, audio
    features merged in, computed by the model's own forward code up to its language model."""

    def capture(_: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        raise _Captured(kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else args[0])

    handle = language_model_of(model).register_forward_pre_hook(capture, with_kwargs=True)
    try:  # through the outer model, so that wrappers (FSDP) gather what they shard
        model(**{key: value for key, value in inputs.items() if key != "inputs_embeds"})
    except _Captured as captured:
        return captured.embeddings.detach()
    finally:
        handle.remove()
    raise RuntimeError(f"{type(backbone_model_of(model)).__name__} never called its language model")


@contextlib.contextmanager
def prompt_embeddings_in_front(model: Any, embeddings: torch.Tensor) -> Iterator[None]:
    """Inside this block the language model's first ``L`` input positions are replaced
    by ``embeddings`` ``[rows, L, H]``: a forward on the prompt ids followed by response
    ids (no audio features, so the audio encoder does not run) then reads the shared
    prompt embeddings, audio included, and the response tokens' own embeddings."""

    def replace(_: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
        computed = kwargs["inputs_embeds"]  # [rows, L + T, H]
        kwargs["inputs_embeds"] = torch.cat([embeddings.to(computed.dtype), computed[:, embeddings.shape[1] :]], dim=1)
        return args, kwargs

    handle = language_model_of(model).register_forward_pre_hook(replace, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def head_on_positions(model: Any, positions: slice) -> Iterator[None]:
    """Inside this block the model's output head sees only ``positions`` of the hidden
    states, so ``logits`` is ``[rows, T, V]`` instead of ``[rows, P + T, V]`` (the
    prompt's positions, audio slots included, are never projected onto the vocabulary)."""
    head = backbone_model_of(model).get_output_embeddings()

    def keep(_: torch.nn.Module, args: tuple) -> tuple:
        return (args[0][:, positions], *args[1:])

    handle = head.register_forward_pre_hook(keep)
    try:
        yield
    finally:
        handle.remove()


def with_prompt_embeddings(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` plus ``inputs_embeds`` ``[P, L, H]`` (audio merged in, computed once),
    which the rollout and both teacher-forced passes of the step share."""
    return {**inputs, "inputs_embeds": embed_prompts(model, inputs)}
