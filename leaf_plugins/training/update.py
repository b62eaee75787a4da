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
from leaf_plugins.training.decoding.keyed_draw import mix64
from leaf_plugins.training.lora import reference_policy
from leaf_plugins.training.prompt_embedding import embed_prompts
from leaf_plugins.training.rollout import response_logprobs
from leaf_plugins.training.sharding import gradients_accumulated_locally
from leaf_plugins.training.whole_step import micro_batch_numbers

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
                         advantages: torch.Tensor, kept: torch.Tensor | None = None) -> dict[str, float]:
    """Back-propagate the step's loss, micro-batch by micro-batch; return the step's loss,
    KL and clip fraction (over all processes). Gradients are synchronised once, at the
    last micro-batch.

    Micro-batches are runs of ``optim.micro_batch_prompts`` consecutive prompts of the
    *step* (positions ``context.first_prompt + i``), so they are the same prompts on one
    process or several wherever the shares' bounds fall on a multiple of that size
    (always with the default of 1). Each is cut to its own longest prompt and response
    (no padding of other prompts), and torch's generator is seeded from the run's seed,
    the step and the micro-batch's number before its pass: LoRA dropout draws the same
    masks for it whatever the number of processes. The logged sums are taken over a
    table of the step's micro-batches in step order, so they are summed in the same order
    on any number of processes.

    :param trainer: the ``Trainer`` (its ``model``, ``policy``, ``accelerator``, ``config``, ``engine``).
    :param advantages: ``[N, T]`` this process's token advantages.
    :param kept: ``[N]`` bool, the rows that count (a dropped group's rows are run with
        weight 0, so every process takes part in every collective); None: all.
    """
    config, inputs, accelerator = trainer.config, context.inputs, trainer.accelerator
    device = accelerator.device
    kept = torch.ones(batch.size, dtype=torch.bool) if kept is None else kept.cpu()
    totals = step_totals(batch.lengths[kept], accelerator)
    first = context.first_prompt
    numbers = micro_batch_numbers(range(first, first + len(context.examples)), config.optim.micro_batch_prompts)
    chunks = [[p for p, n in enumerate(numbers) if n == number] for number in dict.fromkeys(numbers)]
    step_chunks = (config.rollout.prompts_per_step - 1) // config.optim.micro_batch_prompts + 1
    if numbers and numbers[-1] >= step_chunks:
        raise ValueError(f"prompts {first}…{first + len(numbers) - 1} of the step lie beyond its "
                         f"rollout.prompts_per_step={config.rollout.prompts_per_step}")
    table = torch.zeros(step_chunks, 3, dtype=torch.float64, device=device)  # loss, kl, clip share of each micro-batch
    for index, chunk in enumerate(chunks):
        rows = torch.nonzero(torch.isin(rollout.prompt_index, torch.tensor(chunk))).squeeze(1)
        local = _own_extent({key: value[chunk] for key, value in inputs.items()})
        prompt_index = rollout.prompt_index[rows] - chunk[0]
        lengths = batch.lengths[rows]
        width = max(int(lengths.max()), 1) if rows.numel() else 1  # the micro-batch's longest response
        tokens = batch.tokens[rows, :width]
        mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
        weights = (token_weights(lengths, width, totals, config.optim.loss_aggregation, config.rollout.max_new_tokens)
                   * kept[rows].unsqueeze(1)).to(device)
        with torch.no_grad(), reference_policy(trainer.policy):
            reference = response_logprobs(trainer.policy, local, tokens, lengths, prompt_index,
                                          config.rollout.temperature)
        sync = (gradients_accumulated_locally(accelerator, trainer.model) if index < len(chunks) - 1
                else contextlib.nullcontext())  # DDP's no_sync, FSDP2's set_requires_gradient_sync(False)
        torch.manual_seed(_dropout_seed(config.seed, context.step, numbers[chunk[0]]))
        with sync:
            current = response_logprobs(trainer.model, local, tokens, lengths, prompt_index, config.rollout.temperature)
            old = (current.detach() if config.optim.old_logprobs == "teacher_forced"
                   else batch.logprobs[rows, :width].to(device))
            loss = trainer.engine.manager.hook.compute_loss(
                context=context, logprobs=current, old_logprobs=old, reference_logprobs=reference,
                advantages=advantages[rows, :width].to(device), mask=mask, weights=weights,
            )
            accelerator.backward(loss.loss * accelerator.num_processes)  # DDP averages over processes
        table[numbers[chunk[0]]] = torch.stack([loss.loss.detach(), loss.kl, loss.clip_fraction]).double()
    if accelerator.num_processes > 1:  # an entry is one process's value plus zeros (exact), or a straddling
        # micro-batch's two parts
        table = accelerator.reduce(table, reduction="sum")
    sums = table.sum(dim=0)  # the same table, summed in the same order, on any number of processes
    return {"loss": float(sums[0]), "kl": float(sums[1]), "clip_fraction": float(sums[2])}


PROMPT_WIDE = ("input_ids", "attention_mask", "inputs_embeds")
"""The model inputs laid out along the prompt's (left-padded) positions."""


def _own_extent(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` of some prompts without the left padding that none of them needs
    (columns where every prompt is padding)."""
    real = inputs["attention_mask"].bool().any(dim=0)  # [L]
    start = int(real.int().argmax()) if bool(real.any()) else 0
    return {key: value[:, start:] if key in PROMPT_WIDE else value for key, value in inputs.items()}


def _dropout_seed(seed: int, step: int, micro_batch: int) -> int:
    """The seed of torch's generator for one micro-batch's pass (its dropout masks)."""
    words = mix64(torch.tensor([seed, step, micro_batch], dtype=torch.int64))  # [3]
    return int(mix64(words[0] ^ mix64(words[1] ^ mix64(words[2])))) & ((1 << 63) - 1)
