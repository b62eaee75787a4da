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
cut. LoRA dropout is keyed by each row's identity (``keyed_dropout.py``), so the cut
changes nothing but rounding.

Every process makes the same collective calls whatever it holds: in each mini-batch it
runs as many micro-batches as the process with the most (the others' last ones are
stand-ins of weight 0), each pass makes the same forward calls (``teacher_forcing.py``),
and whether an update is finite is decided on the global loss and gradient norm.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import PolicyLoss, Rollout, StepContext
from leaf_plugins.training.aggregation import StepTotals, token_weights
from leaf_plugins.training.finite import check_update
from leaf_plugins.training.keyed_dropout import RowKeys, row_keys
from leaf_plugins.training.lora import reference_policy
from leaf_plugins.training.optimization import clip_gradients, gradient_norm
from leaf_plugins.training.sharding import gradients_accumulated_locally
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.training.whole_step import micro_batch_numbers, micro_batches_per_process, mini_batch_positions

__all__ = ["Learner", "StepData", "MicroBatch", "plan_micro_batches", "mini_batch_totals", "update_policy"]


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


@dataclass(frozen=True)
class StepData:
    """What one step's updates train on: this process's rows, and the whole step's
    counts (the normalisers of each mini-batch's loss, known without a collective)."""

    context: StepContext  # the step: its run config, this process's prompts and their model inputs
    rollout: Rollout  # this process's responses
    advantages: torch.Tensor  # [n, T] this process's token advantages
    kept: torch.Tensor  # [n] bool, this process's rows whose group was not dropped
    whole: RolloutBatch  # the whole step's batch (every process's rows)
    whole_positions: torch.Tensor  # [N] each whole-step row's prompt position in the step
    whole_kept: torch.Tensor  # [N] bool, the whole step's rows that count


@dataclass
class MicroBatch:
    """One forward and backward pass of an update: some of this process's prompts of one
    mini-batch, with what every pass over them reuses."""

    number: int  # its micro-batch number in its mini-batch (``whole_step.micro_batch_numbers``)
    inputs: dict[str, torch.Tensor]  # the prompts' model inputs, cut to their own extent
    prompt_index: torch.Tensor  # [n] each row's prompt in ``inputs``
    group_ids: torch.Tensor  # [n] each row's group id (its dropout keys)
    lengths: torch.Tensor  # [n]
    tokens: torch.Tensor  # [n, w] w: the micro-batch's longest response
    mask: torch.Tensor  # [n, w] bool, on the device
    weights: torch.Tensor  # [n, w] each token's weight in its update's loss (0: padding, dropped or a stand-in)
    advantages: torch.Tensor  # [n, w] on the device
    rollout_logprobs: torch.Tensor  # [n, w] the rollout's log π, on the device
    reference: torch.Tensor | None = None  # [n, w] log π_ref, computed at the first pass
    old: torch.Tensor | None = None  # [n, w] teacher-forced log π_old, computed before the first update

    def dropout_keys(self, seed: int, step: int, pass_number: int) -> RowKeys:
        """The keys of its rows' LoRA dropout masks in pass ``pass_number`` of ``step``."""
        return row_keys(seed, step, pass_number, self.group_ids, self.prompt_index, self.inputs["input_ids"].shape[0])


def plan_micro_batches(data: StepData, totals: StepTotals, mini_batch: int, world: int,
                       device: torch.device) -> list[MicroBatch]:
    """This process's micro-batches of mini-batch ``mini_batch`` (the step's prompts at
    positions ≡ ``mini_batch`` mod ``optim.mini_batches``), as many as the process of
    the ``world`` with the most: where this one has fewer, stand-ins of its first prompt
    with weight 0 make up the count, so that every process takes part in the same
    forward passes and collectives.

    :param totals: the counts of the mini-batch's kept rows over all processes (the
        normalisers of its loss).
    """
    context, rollout = data.context, data.rollout
    config = context.config
    optim, batch = config.optim, rollout.batch
    first, count = context.first_prompt, len(context.examples)
    positions = mini_batch_positions(range(first, first + count), mini_batch, optim.mini_batches)
    numbers = micro_batch_numbers(positions, optim.micro_batch_prompts, optim.mini_batches)
    runs = micro_batches_per_process(config.rollout.prompts_per_step, optim.micro_batch_prompts, world,
                                     optim.mini_batches, mini_batch)
    chunks = [([p - first for p, n in zip(positions, numbers) if n == number], number, True)
              for number in dict.fromkeys(numbers)]
    chunks += [([0], 0, False)] * (runs - len(chunks))  # stand-ins: this process's first prompt, weight 0
    planned = []
    for local, number, real in chunks:
        chunk = torch.tensor(local)
        rows = torch.nonzero(torch.isin(rollout.prompt_index, chunk)).squeeze(1)
        lengths = batch.lengths[rows]
        width = max(int(lengths.max()), 1) if rows.numel() else 1  # the micro-batch's longest response
        weights = token_weights(lengths, width, totals, optim.loss_aggregation, config.rollout.max_new_tokens)
        weights = weights * (data.kept[rows].unsqueeze(1) & real)
        planned.append(MicroBatch(
            number=number, inputs=_own_extent({key: value[local] for key, value in context.inputs.items()}),
            prompt_index=torch.searchsorted(chunk, rollout.prompt_index[rows]), group_ids=batch.group_ids[rows],
            lengths=lengths, tokens=batch.tokens[rows, :width],
            mask=(torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(device),
            weights=weights.to(device), advantages=data.advantages[rows, :width].to(device),
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


def update_policy(learner: Learner, data: StepData,
                  after_step: Callable[[int], None] = lambda update: None) -> dict[str, float]:
    """The step's updates: ``optim.updates_per_rollout`` passes over the rollout, each of
    ``optim.mini_batches`` optimizer steps on one mini-batch of the step's prompts, with
    π_old fixed at the rollout's (or the teacher-forced pass before the first update).
    Each optimizer step's global gradient norm is taken, the loss and norm checked
    finite, and the gradient clipped to ``optim.max_grad_norm``; the learning rate is the
    step's (the scheduler moves on in the trainer). Returns the mean over the updates of
    their loss, KL, clip fraction and gradient norm (before clipping).

    :param after_step: called after each optimizer step with its number in the step
        (0-based; the trainer's ``on_optimizer_step`` hook).
    """
    accelerator, config = learner.accelerator, data.context.config
    optim, device = config.optim, accelerator.device
    data = StepData(data.context, data.rollout, data.advantages, data.kept.cpu(), data.whole, data.whole_positions,
                    data.whole_kept)
    plans = [plan_micro_batches(data, mini_batch_totals(data.whole.lengths, data.whole_positions, data.whole_kept,
                                                        mini, optim.mini_batches),
                                mini, accelerator.num_processes, device) for mini in range(optim.mini_batches)]
    updates = optim.updates_per_rollout * optim.mini_batches
    per_mini = _micro_batches_per_mini_batch(config)
    if optim.old_logprobs == "teacher_forced" and updates > 1:
        _teacher_forced_old(learner, data.context, plans)
    table = torch.zeros(updates, per_mini, 3, dtype=torch.float64, device=device)  # loss, kl, clip of micro-batches
    norms = []
    parameters = [p for p in learner.model.parameters() if p.requires_grad]
    for update in range(updates):
        learner.optimizer.zero_grad()
        _backward(learner, data.context, plans[update % optim.mini_batches], table[update],
                  update // optim.mini_batches)
        table[update] = _summed_over_processes(table[update], accelerator)  # in step order, on every process
        norm = gradient_norm(parameters)  # the same on every process, as the summed loss
        check_update(learner.policy, float(table[update, :, 0].sum()), norm, data.context.step, learner.output_dir)
        if optim.max_grad_norm is not None:
            clip_gradients(parameters, optim.max_grad_norm, norm)
        norms.append(norm)
        learner.optimizer.step()
        after_step(update)
    means = table.sum(dim=1).mean(dim=0)  # each update's sums over its micro-batches, averaged over the updates
    return {"loss": float(means[0]), "kl": float(means[1]), "clip_fraction": float(means[2]),
            "grad_norm": sum(norms) / len(norms), "learning_rate": learner.optimizer.param_groups[0]["lr"]}


def _backward(learner: Learner, context: StepContext, planned: list[MicroBatch], table: torch.Tensor,
              pass_number: int) -> None:
    """Forward and backward over ``planned`` (one update of pass ``pass_number``),
    gradients synchronised across processes at the last micro-batch; each micro-batch's
    own loss, KL and clip share go into ``table`` ``[micro-batches, 3]`` at its number."""
    accelerator, config = learner.accelerator, context.config
    temperature = config.rollout.temperature
    for index, micro in enumerate(planned):
        if micro.reference is None:
            with torch.no_grad(), reference_policy(learner.policy):
                micro.reference = response_logprobs(learner.policy, micro.inputs, micro.tokens, micro.lengths,
                                                    micro.prompt_index, temperature, shared_prefix=True)
        sync = (gradients_accumulated_locally(accelerator, learner.model) if index < len(planned) - 1
                else contextlib.nullcontext())  # DDP's no_sync, FSDP2's set_requires_gradient_sync(False)
        with sync:
            current = response_logprobs(learner.model, micro.inputs, micro.tokens, micro.lengths, micro.prompt_index,
                                        temperature, shared_prefix=True,
                                        dropout_keys=micro.dropout_keys(config.seed, context.step, pass_number))
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


def _teacher_forced_old(learner: Learner, context: StepContext, plans: list[list[MicroBatch]]) -> None:
    """π_old of every micro-batch from a teacher-forced pass of the policy before the
    step's first update, with the dropout masks of its first pass."""
    config = context.config
    with torch.no_grad():
        for planned in plans:
            for micro in planned:
                micro.old = response_logprobs(learner.model, micro.inputs, micro.tokens, micro.lengths,
                                              micro.prompt_index, config.rollout.temperature,
                                              shared_prefix=True,
                                              dropout_keys=micro.dropout_keys(config.seed, context.step, 0))


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
