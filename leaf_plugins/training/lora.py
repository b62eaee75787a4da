"""LoRA on the language model through peft; the reference policy is the same model
with the adapter disabled (no second copy of the weights)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from leaf_plugins.core.backbone import LoadedBackbone

__all__ = ["attach_lora", "load_lora", "reference_policy", "lora_state"]


@contextlib.contextmanager
def _quiet_peft_wrapping() -> Iterator[None]:
    """peft reads the model's ``is_gradient_checkpointing`` when it wraps a model, which
    transformers 5.23 deprecated in favour of ``is_activation_checkpointing``: without
    this, a FutureWarning on every wrap (every run, every evaluated checkpoint)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def attach_lora(loaded: LoadedBackbone, rank: int = 64, alpha: int = 128, dropout: float = 0.05) -> PeftModel:
    """Wrap the backbone's model with a fresh LoRA adapter on the modules named by the
    backbone's ``lora_targets`` (language-model linears only). A backbone whose
    checkpoint ships its own adapter must merge it into the base weights in ``load``, so
    that the disabled-adapter reference is the model users actually run."""
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=loaded.spec.lora_targets,
                        bias="none")
    with _quiet_peft_wrapping():
        return get_peft_model(loaded.model, config)


def load_lora(model: torch.nn.Module, adapter_dir: str) -> PeftModel:
    """``model`` with the LoRA adapter saved in ``adapter_dir`` (a checkpoint's
    ``adapter/``) attached."""
    with _quiet_peft_wrapping():
        return PeftModel.from_pretrained(model, adapter_dir)


@contextlib.contextmanager
def reference_policy(model: PeftModel) -> Iterator[None]:
    """Inside this block the model computes π_ref: the adapter is disabled."""
    with model.disable_adapter():
        yield


def lora_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """A detached copy of the trainable (LoRA) tensors by name: a snapshot of the adapter
    to compare between steps, runs, process counts or a resume (the training tests do);
    checkpoints save the adapter with peft and DCP, not with this."""
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters() if parameter.requires_grad}
