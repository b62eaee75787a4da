"""Plugins replace training stages through the hooks; bad prompts are named."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from leaf_plugins import ConfigError, hookimpl
from leaf_plugins.training.loss import policy_loss
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host


class ConstantScores:
    """Scores every response 0.25 and records the losses it computed."""

    def __init__(self) -> None:
        self.losses = 0

    @hookimpl
    def score_rollouts(self, context, rollout):
        return torch.full((rollout.batch.size,), 0.25)

    @hookimpl
    def compute_loss(self, context, logprobs, old_logprobs, reference_logprobs, advantages, mask):
        self.losses += 1
        return policy_loss(logprobs, old_logprobs, reference_logprobs, advantages, mask, 0.1, 0.0)


def test_plugins_replace_scoring_and_loss(tmp_path):
    plugin = ConstantScores()
    trainer = Trainer(config(tmp_path, "leaf", steps=2), examples(), plugins=[plugin], host=host())
    metrics = trainer.run()
    assert [m["reward_mean"] for m in metrics] == [0.25, 0.25]
    assert all(m["advantage_abs_mean"] == 0 for m in metrics)  # equal rewards: no credit anywhere
    assert plugin.losses == 4  # 2 steps × (4 prompts / micro-batches of 2)


def test_too_long_prompts_are_named(tmp_path):
    cfg = config(tmp_path, "grpo", steps=1)
    cfg = replace(cfg, rollout=replace(cfg.rollout, max_prompt_tokens=3))
    with pytest.raises(ConfigError, match=r"example 'clip-\d+': its prompt has \d+ text tokens, more than rollout.max_prompt_tokens=3"):
        Trainer(cfg, examples(), host=host()).run()
