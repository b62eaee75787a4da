"""The backbone protocol (defined in ``leaf_plugins.core.backbone``), where backbone
plugins import it from, and what the built-in backbones share."""

from __future__ import annotations

from leaf_plugins.core.backbone import AUDIO_PLACEHOLDER, Backbone, LoadedBackbone

__all__ = ["Backbone", "LoadedBackbone", "AUDIO_PLACEHOLDER", "LANGUAGE_MODEL_LINEARS"]

LANGUAGE_MODEL_LINEARS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""peft ``target_modules``: the language model's linear layers only. The audio encoders
reuse some of these names (Qwen2-Audio's attention, Granite's conformer feed-forward)."""
