"""What the built-in backbones share: the modules their LoRA adapters target."""

from __future__ import annotations

__all__ = ["LANGUAGE_MODEL_LINEARS"]

LANGUAGE_MODEL_LINEARS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""peft ``target_modules``: the language model's linear layers only. The audio encoders
reuse some of these names (Qwen2-Audio's attention, Granite's conformer feed-forward)."""
