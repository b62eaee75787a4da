"""Rollout groups for a forkability analysis from a fresh sampling pass: K responses per
example of a task split, from a run's checkpoint (or its starting model), scored with the
run's reward, with the run's rollout settings (temperature, top-p, length)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.evaluation.sampling import Sampling, load_policy, sample_groups
from leaf_plugins.training.config import TrainConfig, task_examples

__all__ = ["sampled_batches"]


def sampled_batches(
    config: TrainConfig, run_dir: Path | None, split: str = "validation", limit: int | None = None,
    host: PluginHost | None = None,
) -> Iterator[RolloutBatch]:
    """Scored rollout batches (``rollout.prompts_per_step`` prompts x ``rollout.group_size``
    responses each) over the first ``limit`` examples of ``split``."""
    host = host or get_host()
    examples = task_examples(config.task, split, host)[:limit]
    reward = configured("reward", config.reward, host.rewards.get(config.reward), config.reward_params)
    policy = load_policy(config.backbone, run_dir, host)
    settings = config.rollout
    sampling = Sampling(settings.group_size, settings.temperature, settings.top_p, settings.max_new_tokens,
                        settings.prompts_per_step, config.seed, settings.backend, settings.backend_params)
    for rollout in sample_groups(policy, examples, sampling, description="sampling rollouts"):
        references = [examples[int(i)].reference for i in rollout.batch.group_ids]
        yield rollout.batch.with_rewards(torch.tensor(reward(rollout.texts, references), dtype=torch.float32))
