"""The updates of one step: passes over the rollout, mini-batches, micro-batches.

A step's rollout trains ``optim.updates_per_rollout`` passes (μ) of
``optim.mini_batches`` optimizer steps each. Mini-batch ``m`` holds the step's prompts at
positions ≡ ``m`` (mod ``mini_batches``) and is cut into micro-batches of
``optim.micro_batch_prompts`` prompts, each a forward and backward pass. π_old stays
the rollout's log π in every pass, so from the second update on the ratio of Eq. 1
moves off 1 and the clip acts.

Every micro-batch's loss is its share of its mini-batch's loss
(``aggregation.token_weights`` normalises by counts over the whole mini-batch, every
process's rows), so the sum of the micro-batches' gradients, and DDP's mean over
processes times their number, is the gradient of the mini-batch's loss however it is
cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import PolicyLoss, Rollout
from leaf_plugins.training.aggregation import StepTotals, token_weights
from leaf_plugins.rollout.decoding.keyed_draw import mix64
from leaf_plugins.training.finite import check_update
from leaf_plugins.training.lora import reference_policy
from leaf_plugins.training.optimization import clip_gradients
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.training.sharding import gradients_accumulated_locally
from leaf_plugins.training.whole_step import micro_batch_numbers, mini_batch_positions

__all__ = ["Learner", "MicroBatch", "plan_micro_batches", "mini_batch_totals", "step_totals", "accumulate_gradients",
           "update_policy"]


def step_totals(lengths: torch.Tensor, accelerator: Any) -> StepTotals:
    """Response tokens and responses of the whole step: this process's ``[n]`` lengths
    summed with every other process's."""
    local = torch.tensor([float(lengths.sum()), float(lengths.numel())], device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return StepTotals(tokens=int(total[0]), sequences=int(total[1]))


@dataclass(frozen=True)
class Learner:
    """What an update steps and reads besides the step's data: the model as the run wraps
    it (DDP, FSDP2), the PeftModel inside it, the optimizer, the accelerator (device,
    process count, collectives), the run's ``compute_loss`` hook and the run's directory
    (named in a non-finite gradient's error)."""

    model: torch.nn.Module
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    accelerator: Any
    compute_loss: Callable[..., PolicyLoss]
    output_dir: Path


@dataclass
class MicroBatch:
    """One forward and backward pass of an update: some of this process's prompts of one
    mini-batch, with what every pass over them reuses."""

    number: int  # its micro-batch number in its mini-batch (``whole_step.micro_batch_numbers``)
    rows: torch.Tensor  # [n] this process's rollout rows
    inputs: dict[str, torch.Tensor]  # the prompts' model inputs, cut to their own extent
    prompt_index: torch.Tensor  # [n] each row's prompt in ``inputs``
    lengths: torch.Tensor  # [n]
    tokens: torch.Tensor  # [n, w] w: the micro-batch's longest response
    mask: torch.Tensor  # [n, w] bool, on the device
    weights: torch.Tensor  # [n, w] each token's weight in its update's loss (0: padding, dropped or a stand-in)
    advantages: torch.Tensor  # [n, w] on the device
    rollout_logprobs: torch.Tensor  # [n, w] the rollout's log π, on the device
    reference: torch.Tensor | None = None  # [n, w] log π_ref, computed at the first pass
    old: torch.Tensor | None = None  # [n, w] teacher-forced log π_old, computed before the first update


def plan_micro_batches(context: Any, rollout: Rollout, batch: RolloutBatch, advantages: torch.Tensor,
                       kept: torch.Tensor, totals: StepTotals, mini_batch: int, config: Any,
                       device: torch.device) -> list[MicroBatch]:
    """This process's micro-batches of mini-batch ``mini_batch`` (the step's prompts at
    positions ≡ ``mini_batch`` mod ``optim.mini_batches``). A process with no prompt in the
    mini-batch gets one stand-in micro-batch of its first prompt with weight 0, so that it
    takes part in the update's collectives.

    :param advantages: ``[n, T]`` this process's token advantages.
    :param kept: ``[n]`` bool, this process's rows whose group was not dropped.
    :param totals: the counts of the mini-batch's kept rows over all processes (the
        normalisers of its loss).
    """
    optim = config.optim
    first, count = context.first_prompt, len(context.examples)
    positions = mini_batch_positions(range(first, first + count), mini_batch, optim.mini_batches)
    stand_in = not positions
    numbers = micro_batch_numbers(positions or [first], optim.micro_batch_prompts, optim.mini_batches)
    if numbers and numbers[-1] >= _micro_batches_per_mini_batch(config):
        raise ValueError(f"prompts {first}…{first + count - 1} of the step lie beyond its "
                         f"rollout.prompts_per_step={config.rollout.prompts_per_step}")
    planned = []
    for number in dict.fromkeys(numbers):
        chunk = torch.tensor([p - first for p, n in zip(positions or [first], numbers) if n == number])  # local
        rows = torch.nonzero(torch.isin(rollout.prompt_index, chunk)).squeeze(1)
        lengths = batch.lengths[rows]
        width = max(int(lengths.max()), 1) if rows.numel() else 1  # the micro-batch's longest response
        weights = token_weights(lengths, width, totals, optim.loss_aggregation, config.rollout.max_new_tokens)
        weights = weights * (kept[rows].unsqueeze(1) & (not stand_in))
        planned.append(MicroBatch(
            number=number, rows=rows,
            inputs=_own_extent({key: value[chunk.tolist()] for key, value in context.inputs.items()}),
            prompt_index=torch.searchsorted(chunk, rollout.prompt_index[rows]),
            lengths=lengths, tokens=batch.tokens[rows, :width],
            mask=(torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(device),
            weights=weights.to(device), advantages=advantages[rows, :width].to(device),
            rollout_logprobs=batch.logprobs[rows, :width].to(device),
        ))
    return planned


def mini_batch_totals(lengths: torch.Tensor, positions: torch.Tensor, kept: torch.Tensor, mini_batch: int,
                      mini_batches: int) -> StepTotals:
    """The response tokens and responses of a mini-batch's kept rows, from the whole step.

    :param lengths: ``[N]`` the whole step's response lengths.
    :param positions: ``[N]`` each row's prompt position in the step.
    :param kept: ``[N]`` bool, the rows whose group was not dropped.
    """
    rows = kept & (positions % mini_batches == mini_batch)
    return StepTotals(tokens=int(lengths[rows].sum()), sequences=int(rows.sum()))


def accumulate_gradients(learner: Learner, config: Any, context: Any, rollout: Rollout, batch: RolloutBatch,
                         advantages: torch.Tensor, kept: torch.Tensor | None = None,
                         totals: StepTotals | None = None) -> dict[str, float]:
    """Back-propagate the loss of one whole-step update (one mini-batch of all the step's
    prompts) over this process's rows; return its loss, KL and clip fraction (over all
    processes). ``update_policy`` runs the run's passes and mini-batches this way.

    :param config: the run's ``TrainConfig``.
    :param advantages: ``[n, T]`` this process's token advantages.
    :param kept: ``[n]`` bool, the rows that count; None: all.
    :param totals: the step's counts over all processes; None: summed across them here.
    """
    kept = torch.ones(batch.size, dtype=torch.bool) if kept is None else kept.cpu()
    totals = step_totals(batch.lengths[kept], learner.accelerator) if totals is None else totals
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, mini_batches=1))
    device = learner.accelerator.device
    planned = plan_micro_batches(context, rollout, batch, advantages, kept, totals, 0, config, device)
    table = torch.zeros(_micro_batches_per_mini_batch(config), 3, dtype=torch.float64, device=device)
    _backward(learner, context, planned, table, 0, config)
    table = _summed_over_processes(table, learner.accelerator)
    sums = table.sum(dim=0)
    return {"loss": float(sums[0]), "kl": float(sums[1]), "clip_fraction": float(sums[2])}


def update_policy(learner: Learner, config: Any, context: Any, rollout: Rollout, batch: RolloutBatch,
                  advantages: torch.Tensor, kept: torch.Tensor, whole: RolloutBatch, whole_positions: torch.Tensor,
                  whole_kept: torch.Tensor, on_first_step: Callable[[], None] = lambda: None,
                  after_step: Callable[[int], None] = lambda update: None) -> dict[str, float]:
    """The step's updates: ``optim.updates_per_rollout`` passes over the rollout, each of
    ``optim.mini_batches`` optimizer steps on one mini-batch of the step's prompts, with
    π_old fixed at the rollout's (or the teacher-forced pass before the first update).
    Each optimizer step's gradient is checked finite, its global norm taken and clipped
    to ``optim.max_grad_norm``; the learning rate is the step's (the scheduler moves on
    in the trainer). Returns the mean over the updates of their loss, KL, clip fraction
    and gradient norm (before clipping).

    :param advantages: ``[n, T]`` this process's token advantages; ``kept``: ``[n]`` its rows that count.
    :param whole: the whole step's batch (every process's rows), ``whole_positions`` ``[N]``
        each row's prompt position in the step and ``whole_kept`` ``[N]`` the rows that
        count: the normalisers of each mini-batch's loss, without a collective.
    :param on_first_step: called just before the first optimizer step (the trainer holds
        interrupts from there until the step is logged).
    :param after_step: called after each optimizer step with its number in the step
        (0-based; the trainer's ``on_optimizer_step`` hook).
    """
    accelerator = learner.accelerator
    optim, device = config.optim, accelerator.device
    kept = kept.cpu()
    plans = [plan_micro_batches(context, rollout, batch, advantages, kept,
                                mini_batch_totals(whole.lengths, whole_positions, whole_kept, mini, optim.mini_batches),
                                mini, config, device) for mini in range(optim.mini_batches)]
    updates = optim.updates_per_rollout * optim.mini_batches
    per_mini = _micro_batches_per_mini_batch(config)
    if optim.old_logprobs == "teacher_forced" and updates > 1:
        _teacher_forced_old(learner, config, context, plans, per_mini)
    table = torch.zeros(updates, per_mini, 3, dtype=torch.float64, device=device)  # loss, kl, clip of micro-batches
    norms = []
    parameters = [p for p in learner.model.parameters() if p.requires_grad]
    for update in range(updates):
        learner.optimizer.zero_grad()
        _backward(learner, context, plans[update % optim.mini_batches], table[update], update * per_mini, config)
        check_update(learner.policy, float(table[update, :, 0].sum()), context.step + 1, learner.output_dir)
        norms.append(clip_gradients(parameters, optim.max_grad_norm))
        if update == 0:
            on_first_step()
        learner.optimizer.step()
        after_step(update)
    sums = _summed_over_processes(table, accelerator).sum(dim=1)  # [updates, 3]: each update's, summed in step order
    means = sums.mean(dim=0)
    return {"loss": float(means[0]), "kl": float(means[1]), "clip_fraction": float(means[2]),
            "grad_norm": sum(norms) / len(norms), "learning_rate": learner.optimizer.param_groups[0]["lr"]}


def _backward(learner: Learner, context: Any, planned: list[MicroBatch], table: torch.Tensor, first_seed: int,
              config: Any) -> None:
    """Forward and backward over ``planned`` (one update), gradients synchronised across
    processes at the last micro-batch; each micro-batch's own loss, KL and clip share go
    into ``table`` ``[micro-batches, 3]`` at its number. Torch's generator is seeded
    before each pass from the run's seed, the step and ``first_seed`` plus the
    micro-batch's number (its LoRA dropout masks)."""
    accelerator, temperature = learner.accelerator, config.rollout.temperature
    for index, micro in enumerate(planned):
        if micro.reference is None:
            with torch.no_grad(), reference_policy(learner.policy):
                micro.reference = response_logprobs(learner.policy, micro.inputs, micro.tokens, micro.lengths,
                                                    micro.prompt_index, temperature)
        sync = (gradients_accumulated_locally(accelerator, learner.model) if index < len(planned) - 1
                else contextlib.nullcontext())  # DDP's no_sync, FSDP2's set_requires_gradient_sync(False)
        torch.manual_seed(_dropout_seed(config.seed, context.step, first_seed + micro.number))
        with sync:
            current = response_logprobs(learner.model, micro.inputs, micro.tokens, micro.lengths, micro.prompt_index,
                                        temperature)
            if config.optim.old_logprobs == "rollout":
                old = micro.rollout_logprobs
            else:  # teacher_forced: before the first update (one update: this very pass)
                old = micro.old if micro.old is not None else current.detach()
            loss = learner.compute_loss(
                context=context, logprobs=current, old_logprobs=old, reference_logprobs=micro.reference,
                advantages=micro.advantages, mask=micro.mask, weights=micro.weights,
            )
            accelerator.backward(loss.loss * accelerator.num_processes)  # DDP averages over processes
        table[micro.number] += torch.stack([loss.loss.detach(), loss.kl, loss.clip_fraction]).double()


def _teacher_forced_old(learner: Learner, config: Any, context: Any, plans: list[list[MicroBatch]],
                        per_mini: int) -> None:
    """π_old of every micro-batch from a teacher-forced pass of the policy before the
    step's first update, under the dropout masks of its first pass."""
    with torch.no_grad():
        for mini, planned in enumerate(plans):
            for micro in planned:
                torch.manual_seed(_dropout_seed(config.seed, context.step, mini * per_mini + micro.number))
                micro.old = response_logprobs(learner.model, micro.inputs, micro.tokens, micro.lengths,
                                              micro.prompt_index, config.rollout.temperature)


def _micro_batches_per_mini_batch(config: Any) -> int:
    """The most micro-batches a mini-batch of the step has (the first mini-batch's)."""
    optim = config.optim
    prompts = -(-config.rollout.prompts_per_step // optim.mini_batches)
    return -(-prompts // optim.micro_batch_prompts)


def _summed_over_processes(table: torch.Tensor, accelerator: Any) -> torch.Tensor:
    """``table`` summed over the processes: an entry is one process's value plus zeros
    (exact), or a micro-batch's parts on the processes whose shares it straddles."""
    return accelerator.reduce(table, reduction="sum") if accelerator.num_processes > 1 else table


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
