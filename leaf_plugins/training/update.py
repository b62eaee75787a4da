"""The gradient of one step, accumulated over micro-batches of prompts.

Every micro-batch's loss is its share of the step's loss (``aggregation.token_weights``
normalises by counts over the whole step, gathered across processes), so the sum of
the micro-batches' gradients, and DDP's mean over processes times their number, is the
gradient of the step's loss however the step is cut.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import Rollout
from leaf_plugins.training.aggregation import StepTotals, token_weights
from leaf_plugins.training.lora import reference_policy
from leaf_plugins.training.prompt_embedding import embed_prompts
from leaf_plugins.training.rollout import response_logprobs

__all__ = ["step_totals", "accumulate_gradients", "with_prompt_embeddings"]


def with_prompt_embeddings(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` plus ``inputs_embeds`` ``[P, L, H]`` (audio merged in, computed once),
    which the rollout and both teacher-forced passes of the step share."""
    return {**inputs, "inputs_embeds": embed_prompts(model, inputs)}


def step_totals(lengths: torch.Tensor, accelerator: Any) -> StepTotals:
    """Response tokens and responses of the whole step: this process's ``[n]`` lengths
    summed with every other process's."""
    local = torch.tensor([float(lengths.sum()), float(lengths.numel())], device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return StepTotals(tokens=int(total[0]), sequences=int(total[1]))


def accumulate_gradients(trainer: Any, context: Any, rollout: Rollout, batch: RolloutBatch,
                         advantages: torch.Tensor) -> dict[str, float]:
    """Back-propagate the step's loss, micro-batch by micro-batch (``optim.micro_batch_prompts``
    prompts with their K responses each); return the step's loss, KL and clip fraction
    (over all processes). Gradients are synchronised once, at the last micro-batch.

    :param trainer: the ``Trainer`` (its ``model``, ``policy``, ``accelerator``, ``config``, ``engine``).
    :param advantages: ``[N, T]`` this process's token advantages.
    """
    config, inputs, accelerator = trainer.config, context.inputs, trainer.accelerator
    device = accelerator.device
    totals = step_totals(batch.lengths, accelerator)
    prompts = inputs["attention_mask"].shape[0]
    size = config.optim.micro_batch_prompts
    chunks = [list(range(i, min(i + size, prompts))) for i in range(0, prompts, size)]
    sums = torch.zeros(3, device=device)  # loss, kl, clip fraction: this process's share of the step's
    for index, chunk in enumerate(chunks):
        rows = torch.nonzero(torch.isin(rollout.prompt_index, torch.tensor(chunk))).squeeze(1)
        local = {key: value[chunk] for key, value in inputs.items()}
        prompt_index = rollout.prompt_index[rows] - chunk[0]
        tokens, lengths = batch.tokens[rows], batch.lengths[rows]
        mask = (torch.arange(batch.width).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
        weights = token_weights(lengths, batch.width, totals, config.optim.loss_aggregation,
                                config.rollout.max_new_tokens).to(device)
        with torch.no_grad(), reference_policy(trainer.policy):
            reference = response_logprobs(trainer.policy, local, tokens, lengths, prompt_index,
                                          config.rollout.temperature)
        sync = accelerator.no_sync(trainer.model) if index < len(chunks) - 1 else contextlib.nullcontext()
        with sync:
            current = response_logprobs(trainer.model, local, tokens, lengths, prompt_index, config.rollout.temperature)
            old = current.detach() if config.optim.old_logprobs == "teacher_forced" else batch.logprobs[rows].to(device)
            loss = trainer.engine.manager.hook.compute_loss(
                context=context, logprobs=current, old_logprobs=old,
                reference_logprobs=reference, advantages=advantages[rows].to(device), mask=mask, weights=weights,
            )
            accelerator.backward(loss.loss * accelerator.num_processes)  # DDP averages over processes
        sums += torch.stack([loss.loss.detach(), loss.kl, loss.clip_fraction]).float()
    if accelerator.num_processes > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    return {"loss": float(sums[0]), "kl": float(sums[1]), "clip_fraction": float(sums[2])}
