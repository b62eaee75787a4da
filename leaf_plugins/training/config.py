"""The run configuration; defaults are the paper's Table 7."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackboneConfig", "EstimatorConfig", "RolloutConfig", "OptimConfig", "LoraSettings", "TrainConfig"]


@dataclass
class BackboneConfig:
    name: str = "tiny-qwen2-audio"
    path: str | None = None  # hub id or local directory; default: the backbone's own
    dtype: str | None = None
    seed: int = 0  # weights of the built-in tiny backbones


@dataclass
class EstimatorConfig:
    name: str = "leaf"
    params: dict[str, Any] = field(default_factory=dict)  # e.g. {fork_budget: 2}
    stages: dict[str, str] = field(default_factory=dict)  # e.g. {select_boundaries: collision}


@dataclass
class RolloutConfig:
    group_size: int = 8  # K
    prompts_per_step: int = 6  # rollout batch = training batch
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_p: float = 0.9
    surprisal_from: str = "sampling"


@dataclass
class OptimConfig:
    learning_rate: float = 5e-6
    micro_batch_prompts: int = 1  # prompts (each with its K responses) per forward/backward
    clip_epsilon: float = 0.2
    kl_coefficient: float = 0.02


@dataclass
class LoraSettings:
    rank: int = 64
    alpha: int = 128
    dropout: float = 0.05


@dataclass
class TrainConfig:
    """One training run."""

    output_dir: str = "runs/default"
    seed: int = 0
    steps: int = 100
    checkpoint_every: int = 10
    reward: str = "sentence_bleu"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
