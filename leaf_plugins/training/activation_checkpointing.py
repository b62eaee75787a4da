"""Activation checkpointing of the language model (``optim.activation_checkpointing``)."""

from __future__ import annotations

from typing import Any

import torch

from leaf_plugins.rollout.prompt_embedding import language_model_of

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
    _checkpoint_only_with_grad(language_model)


def _checkpoint_only_with_grad(language_model: torch.nn.Module) -> None:
    """Before transformers 5.24 a checkpointed layer in train mode runs through
    ``torch.utils.checkpoint`` under ``torch.no_grad()`` too (the reference policy's pass),
    and the step's gradients then differed from those without checkpointing (by as much as
    the gradients themselves: tests/test_loss_aggregation.py at 5.15-5.23); 5.24 runs such
    layers plainly. These hooks do the same on every version: for the length of each
    forward pass the layers checkpoint only if gradients are being recorded."""
    layers = [module for module in language_model.modules() if getattr(module, "gradient_checkpointing", False) is True]

    def follow_grad_mode(_module: torch.nn.Module, _args: Any) -> None:
        for layer in layers:
            layer.gradient_checkpointing = torch.is_grad_enabled()

    def restore(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        for layer in layers:
            layer.gradient_checkpointing = True

    language_model.register_forward_pre_hook(follow_grad_mode)
    language_model.register_forward_hook(restore)


def activation_checkpointing_enabled(model: Any) -> bool:
    """Whether the language model's layers recompute their activations (read from the
    layers' own ``gradient_checkpointing`` flag, which every transformers 5 release sets;
    ``is_gradient_checkpointing`` warns from 5.23 and ``is_activation_checkpointing`` is
    missing before)."""
    return any(getattr(module, "gradient_checkpointing", False) is True for module in language_model_of(model).modules())
