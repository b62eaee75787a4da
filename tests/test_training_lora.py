"""LoRA on the language model only, and the disabled-adapter reference policy."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from leaf_plugins import get_host
from leaf_plugins.training.activation_checkpointing import (activation_checkpointing_enabled,
                                                              enable_activation_checkpointing)
from leaf_plugins.training.lora import attach_lora, lora_state, reference_policy


def test_lora_targets_the_language_model_only_and_the_reference_is_the_base_model():
    backbone = get_host().backbones.get("tiny-qwen2-audio")
    loaded = backbone.load(seed=3)
    inputs = backbone.build_inputs(loaded, ["<|audio|> who?"], [np.zeros(16000, np.float32)])
    loaded.model.eval()
    with torch.no_grad():
        base_logits = loaded.model(**inputs).logits
    model = attach_lora(loaded, rank=4, alpha=8, dropout=0.0)
    wrapped = [name for name, _ in model.named_modules() if name.endswith("lora_A")]
    assert wrapped and all("language_model" in name for name in wrapped)
    assert not any("audio_tower" in name for name in wrapped)
    assert all("lora_" in name for name in lora_state(model))
    # train the adapter a little so that it changes the policy
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        optimiser.zero_grad()
        model(**inputs).logits.square().mean().backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        adapted = model(**inputs).logits
        with reference_policy(model):
            reference = model(**inputs).logits
    assert not torch.allclose(adapted, base_logits, atol=1e-4)
    assert torch.equal(reference, base_logits)


def test_lora_and_activation_checkpointing_use_no_deprecated_api():
    """transformers 5.23 deprecated ``is_gradient_checkpointing`` (read by peft when it wraps a
    model) and ``gradient_checkpointing_enable``: neither may print a warning on every run."""
    loaded = get_host().backbones.get("tiny-granite-speech").load(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = attach_lora(loaded, rank=4, alpha=8, dropout=0.0)
        assert not activation_checkpointing_enabled(model)
        enable_activation_checkpointing(model)
    assert activation_checkpointing_enabled(model)
