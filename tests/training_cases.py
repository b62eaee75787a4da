"""Shared setup of the trainer tests: a reward a random model can improve on (the share
of vowels in the response), registered as a plugin, and small spoken examples."""

from __future__ import annotations

import numpy as np

from leaf_plugins import hookimpl
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.task import Example
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


def fixed_step(trainer, prompts: list[Example], rank: int = 0, world: int = 1, seed: int = 0):
    """A step on ``prompts`` that every process can rebuild identically: sampled with a
    fixed seed from the initial weights, then responses cut to random lengths (so groups
    differ in length) with random token advantages. Returns the ``StepData`` of process
    ``rank`` of ``world`` (its contiguous share of the prompts, as the trainer's), whose
    ``whole`` is the whole step's batch."""
    from dataclasses import replace

    import torch

    from leaf_plugins.core.stages import Rollout, RolloutRequest, StepContext
    from leaf_plugins.rollout.prompt_embedding import with_prompt_embeddings
    from leaf_plugins.rollout.sampling import sample_responses
    from leaf_plugins.training.update import StepData
    from leaf_plugins.training.whole_step import prompt_share

    backbone, loaded, policy = trainer.backbone, trainer.loaded, trainer.policy
    inputs = with_prompt_embeddings(policy, backbone.build_inputs(loaded, [e.prompt for e in prompts],
                                                                  [e.audio for e in prompts]))
    torch.manual_seed(seed)
    settings = trainer.config.rollout
    rollout = sample_responses(RolloutRequest(policy, loaded, inputs, settings.group_size, settings.max_new_tokens))
    generator = torch.Generator().manual_seed(seed)
    batch = rollout.batch
    lengths = torch.minimum(batch.lengths, torch.randint(1, batch.width + 1, (batch.size,), generator=generator))
    real = torch.arange(batch.width).unsqueeze(0) < lengths.unsqueeze(1)
    batch = replace(batch, tokens=torch.where(real, batch.tokens, -1), lengths=lengths,
                    logprobs=torch.where(real, batch.logprobs, 0.0) - 0.1 * real)  # ratios != 1: clipping matters
    advantages = torch.randn(batch.tokens.shape, generator=generator) * real
    share = prompt_share(len(prompts), rank, world)
    rows = torch.nonzero((rollout.prompt_index >= share.start) & (rollout.prompt_index < share.stop)).squeeze(1)
    mine = Rollout(batch=batch.select(rows), texts=[rollout.texts[i] for i in rows.tolist()],
                   prompt_index=rollout.prompt_index[rows] - share.start)
    local = {key: value[share.start : share.stop] for key, value in inputs.items()}
    context = StepContext(1, policy, loaded, prompts[share.start : share.stop], local, trainer.config,
                          first_prompt=share.start)
    everything = torch.ones(batch.size, dtype=torch.bool)
    shares = tuple(tuple(range(prompt_share(len(prompts), r, world).start, prompt_share(len(prompts), r, world).stop))
                   for r in range(world))  # each process's prompts' step positions
    return StepData(context, mine, advantages[rows], everything[rows], batch, rollout.prompt_index, everything, shares)


def step_gradient(trainer, prompts: list[Example], rank: int = 0, world: int = 1) -> dict:
    """The LoRA gradient the trainer's update (``update_policy``) leaves for process
    ``rank``'s share of ``fixed_step`` (after DDP's all-reduce when several processes run
    it), stepped by an optimizer of learning rate 0 so that the weights stay as they are."""
    from dataclasses import replace

    import torch

    from leaf_plugins.training.update import update_policy

    data = fixed_step(trainer, prompts, rank, world)
    trainer.model.train()
    unmoved = replace(trainer.learner, optimizer=torch.optim.SGD(
        [p for p in trainer.policy.parameters() if p.requires_grad], lr=0.0))
    update_policy(unmoved, data)
    grads = {name: p.grad.clone() for name, p in trainer.policy.named_parameters() if p.requires_grad}
    trainer.optimizer.zero_grad()
    trainer.model.eval()
    return grads
