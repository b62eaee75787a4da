"""Activation checkpointing of the language model (``optim.activation_checkpointing``)."""

from __future__ import annotations

from typing import Any

from leaf_plugins.training.prompt_embedding import language_model_of

__all__ = ["enable_activation_checkpointing", "activation_checkpointing_enabled"]

CHECKPOINT_KWARGS = {"use_reentrant": False}
"""Non-reentrant ``torch.utils.checkpoint``: works with a frozen input and LoRA, and
restores the random state, so dropout masks are the same in the recomputation."""


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute the language model's layer activations in the backward pass instead of
    keeping them. Only training passes are affected; the audio encoder is frozen and runs
    without gradients anyway.

    transformers 5.23 renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` (the old name warns from then on): the new name is
    used where it exists, the old one before."""
    language_model = language_model_of(model)
    if hasattr(language_model, "activation_checkpointing_enable"):
        language_model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(CHECKPOINT_KWARGS))
    else:
        language_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINT_KWARGS))


def activation_checkpointing_enabled(model: Any) -> bool:
    """Whether the language model's layers recompute their activations (read from the
    layers' own ``gradient_checkpointing`` flag, which every transformers 5 release sets;
    ``is_gradient_checkpointing`` warns from 5.23 and ``is_activation_checkpointing`` is
    missing before)."""
    return any(getattr(module, "gradient_checkpointing", False) is True for module in language_model_of(model).modules())
