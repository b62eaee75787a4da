"""Activation checkpointing of the language model (``optim.activation_checkpointing``)."""

from __future__ import annotations

from typing import Any

from leaf_plugins.training.prompt_embedding import language_model_of

__all__ = ["enable_activation_checkpointing"]


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute the language model's layer activations in the backward pass instead of
    keeping them (non-reentrant ``torch.utils.checkpoint``: works with a frozen input and
    LoRA, keeps dropout's random state). Only training passes are affected; the audio
    encoder is frozen and runs without gradients anyway."""
    language_model_of(model).activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
