"""RL training improves a learnable reward, for GRPO and for LEAF, by a statistical test
on held-out rollouts."""

from __future__ import annotations

import json
import math

import pytest
import torch

from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host, vowel_share


def held_out_rewards(trainer: Trainer, seed: int) -> torch.Tensor:
    """Rewards of 8 samples for each of 8 prompts, sampled with a fixed seed."""
    chosen = examples()[:8]
    inputs = trainer.backbone.build_inputs(trainer.loaded, [e.prompt for e in chosen], [e.audio for e in chosen])
    torch.manual_seed(seed)
    rollout = sample_responses(RolloutRequest(trainer.policy, trainer.loaded, inputs, group_size=8, max_new_tokens=16))
    return torch.tensor(vowel_share(rollout.texts, []))


@pytest.mark.parametrize("estimator", ["grpo", "leaf"])
def test_training_raises_the_held_out_reward_significantly(estimator, tmp_path):
    trainer = Trainer(config(tmp_path, estimator, steps=15, checkpoint_every=100), examples(), host=host())
    before = held_out_rewards(trainer, seed=123)
    metrics = trainer.run()
    after = held_out_rewards(trainer, seed=123)
    # one-sided Welch z-test at the 0.1% level (z > 3.09), over 64 held-out samples each
    standard_error = math.sqrt(before.var() / len(before) + after.var() / len(after))
    z = float(after.mean() - before.mean()) / standard_error
    assert z > 3.09, (before.mean(), after.mean(), z)
    logged = [json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 15 and [record["step"] for record in logged] == list(range(1, 16))  # one per step, in order
    assert [record["reward_mean"] for record in logged] == pytest.approx([m["reward_mean"] for m in metrics])
