"""Building random-weight backbones: the tiny ones, and the real models' shapes for
measuring a step (no download)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["seeded_model", "random_model_on"]


def seeded_model(model_class: Any, config: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
    """``model_class(config)`` in float32 on the CPU with weights drawn from ``seed`` (the
    global RNG is left as it was) and generation set up for ``tokenizer``'s pad and EOS
    tokens."""
    return random_model_on(model_class, config, tokenizer, seed, "cpu", torch.float32)


def random_model_on(model_class: Any, config: Any, tokenizer: Any, seed: int, device: str,
                    dtype: torch.dtype) -> torch.nn.Module:
    """``model_class`` built from ``config`` directly on ``device`` in ``dtype`` with
    weights drawn from ``seed`` (a 7–8B model is never materialised on the host first);
    generation set up for ``tokenizer`` as in ``seeded_model``."""
    with torch.random.fork_rng(devices=[] if torch.device(device).type == "cpu" else None), torch.device(device):
        torch.manual_seed(seed)
        model = model_class._from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
