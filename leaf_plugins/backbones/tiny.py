"""Building the random-weight tiny backbones."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["seeded_model"]


def seeded_model(model_class: Any, config: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
    """``model_class(config)`` with weights drawn from ``seed`` (the global RNG is left as
    it was) and generation set up for ``tokenizer``'s pad and EOS tokens."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
