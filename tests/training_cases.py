"""Shared setup of the trainer tests: a reward a random model can improve on (the share
of vowels in the response), registered as a plugin, and small spoken examples."""

from __future__ import annotations

import numpy as np

from leaf_plugins import hookimpl
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.tasks.base import Example
from leaf_plugins.training.config import EstimatorConfig, LoraSettings, OptimConfig, RolloutConfig, TrainConfig


def vowel_share(predictions: list[str], references: list[str]) -> list[float]:
    """Share of the response's characters that are vowels."""
    return [sum(c in "aeiou" for c in p) / max(len(p), 1) for p in predictions]


class TestRewards:
    @hookimpl
    def register_rewards(self, register):
        register("vowel_share", vowel_share)


def host() -> PluginHost:
    return PluginHost.discover(extra_plugins=[("test-rewards", TestRewards())], strict=True)


def examples(count: int = 16) -> list[Example]:
    rng = np.random.default_rng(0)
    return [
        Example(f"clip-{i}", (rng.standard_normal(16000) * 0.1).astype(np.float32), "<|audio|> say something", "", 1.0)
        for i in range(count)
    ]


def config(output_dir, estimator: str = "grpo", steps: int = 4, checkpoint_every: int = 2) -> TrainConfig:
    return TrainConfig(
        output_dir=str(output_dir),
        steps=steps,
        checkpoint_every=checkpoint_every,
        reward="vowel_share",
        estimator=EstimatorConfig(name=estimator),
        rollout=RolloutConfig(group_size=8, prompts_per_step=4, max_new_tokens=16),
        optim=OptimConfig(learning_rate=3e-2, micro_batch_prompts=2),
        lora=LoraSettings(rank=8, alpha=16, dropout=0.0),
    )
