"""The backbone protocol: what a speech-LLM backbone plugin provides to the trainer (what a
``register_backbones`` plugin registers, and what the hookspecs point to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["Backbone", "LoadedBackbone", "AUDIO_PLACEHOLDER"]

AUDIO_PLACEHOLDER = "<|audio|>"
"""Backbone-neutral audio placeholder used in task prompts; each backbone rewrites it."""

@dataclass
class LoadedBackbone:
    """A loaded model with everything needed to build its inputs."""

    model: "torch.nn.Module"  # the transformers model (before LoRA is attached)
    processor: Any  # the transformers processor (feature extractor + tokenizer)
    tokenizer: Any  # the tokenizer (also reachable from the processor)
    spec: "Backbone"


@runtime_checkable
class Backbone(Protocol):
    """A registered backbone (``register_backbones``).

    Attributes: ``hub_id`` (default checkpoint, or ``None`` for built-in tiny models),
    ``lora_targets`` (peft ``target_modules``: names or a regex restricted to the
    language model), ``dtype`` (default torch dtype name) and ``sampling_rate`` (16000).
    """

    hub_id: str | None
    lora_targets: Any
    dtype: str
    sampling_rate: int

    def load(self, path: str | None = None, dtype: str | None = None, seed: int = 0) -> LoadedBackbone:
        """Load the model and processor from ``path`` (hub id or local directory;
        default ``hub_id``). Built-in tiny backbones build random weights from ``seed``."""
        ...

    def build_inputs(
        self, loaded: LoadedBackbone, prompts: Sequence[str], audios: Sequence["np.ndarray"]
    ) -> dict[str, "torch.Tensor"]:
        """Model inputs for a batch of prompts (with ``<|audio|>`` placeholders) and 16 kHz
        float waveforms: chat template applied, placeholder rewritten, left padded."""
        ...
