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

The reference pass (π_ref, the adapter disabled) runs once per micro-batch, at the first
pass, only where the loss has a KL term or the trainer has not computed it already
(``optim.kl_in: reward`` computes it before the estimator: ``reference_logprobs``); with
``optim.kl_coefficient: 0`` it does not run at all. The first update's passes, at θ_old,
also measure the gap between the rollout's log π and the trainer's
(``importance_correction.mismatch_sums``), and with ``optim.rollout_correction`` weigh each
token (``importance_correction.correction_weights``).
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
from leaf_plugins.training.loss import LossSettings
from leaf_plugins.training.optimization import clip_gradients, gradient_norm
from leaf_plugins.training.importance_correction import correction_weights, mismatch_sums
from leaf_plugins.training.sharding import gradients_accumulated_locally
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.training.whole_step import PROMPT_WIDE, micro_batch_numbers

__all__ = ["Learner", "StepData", "MicroBatch", "plan_micro_batches", "mini_batch_totals", "update_policy",
           "reference_logprobs", "UPDATE_COLUMNS"]

UPDATE_COLUMNS = ("loss", "kl", "clip_fraction", "clip_fraction_low", "clip_fraction_high", "entropy_sum",
                  "tokens", "gap_sum", "mismatch_kl_sum")
"""What each micro-batch of an update adds to the step's table (summed over processes in
step order): its share of the loss, KL and clip fractions (token weights), and sums over
its response tokens of the entropy and (first update) the rollout/trainer gap."""


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
    rollout: Rollout  # this process's responses (prompt_index: rows of context.inputs)
    advantages: torch.Tensor  # [n, T] this process's token advantages
    kept: torch.Tensor  # [n] bool, this process's rows whose group was not dropped
    whole: RolloutBatch  # the whole step's batch (every process's rows)
    whole_positions: torch.Tensor  # [N] each whole-step row's prompt position in the step
    whole_kept: torch.Tensor  # [N] bool, the whole step's rows that count
    shares: tuple[tuple[int, ...], ...]  # each process's prompts' step positions (its inputs' rows, in order)
    reference: torch.Tensor | None = None  # [n, T] log π_ref of this process's rows, where computed already


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
    reference: torch.Tensor | None = None  # [n, w] log π_ref, given or computed at the first pass
    rows: torch.Tensor | None = None  # [n] this process's rollout rows
    old: torch.Tensor | None = None  # [n, w] teacher-forced log π_old, computed before the first update

    def dropout_keys(self, seed: int, step: int, pass_number: int) -> RowKeys:
        """The keys of its rows' LoRA dropout masks in pass ``pass_number`` of ``step``."""
        return row_keys(seed, step, pass_number, self.group_ids, self.prompt_index, self.inputs["input_ids"].shape[0])


def plan_micro_batches(data: StepData, totals: StepTotals, mini_batch: int, rank: int,
                       device: torch.device) -> list[MicroBatch]:
    """Process ``rank``'s micro-batches of mini-batch ``mini_batch`` (the step's prompts at
    positions ≡ ``mini_batch`` mod ``optim.mini_batches``), as many as the process with
    the most (``data.shares``): where this one has fewer, stand-ins of its first prompt
    with weight 0 make up the count, so that every process takes part in the same
    forward passes and collectives.

    :param totals: the counts of the mini-batch's kept rows over all processes (the
        normalisers of its loss).
    """
    context, rollout = data.context, data.rollout
    config = context.config
    optim, batch = config.optim, rollout.batch
    counts = [len(set(_numbers(share, mini_batch, optim.mini_batches, optim.micro_batch_prompts).values()))
              for share in data.shares]
    numbers = _numbers(data.shares[rank], mini_batch, optim.mini_batches, optim.micro_batch_prompts)  # local row -> n
    chunks = [([local for local, n in numbers.items() if n == number], number, True)
              for number in dict.fromkeys(numbers.values())]
    chunks += [([0], 0, False)] * (max(max(counts), 1) - len(chunks))  # stand-ins: the first prompt, weight 0
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
            reference=None if data.reference is None else data.reference[rows, :width].to(device),
            rows=rows,
        ))
    return planned


def _numbers(share: tuple[int, ...], mini_batch: int, mini_batches: int, micro_batch_prompts: int) -> dict[int, int]:
    """Local row (index in ``share``) -> micro-batch number of the prompts of ``share`` (step
    positions) in mini-batch ``mini_batch`` (``whole_step.micro_batch_numbers``)."""
    local = [index for index, position in enumerate(share) if position % mini_batches == mini_batch]
    return dict(zip(local, micro_batch_numbers([share[index] for index in local], micro_batch_prompts, mini_batches)))


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
    their loss, KL, clip fractions, entropy per token and gradient norm (before
    clipping), and the first update's rollout/trainer gap.

    :param after_step: called after each optimizer step with its number in the step
        (0-based; the trainer's ``on_optimizer_step`` hook).
    """
    accelerator, config = learner.accelerator, data.context.config
    optim, device = config.optim, accelerator.device
    plans = _plans(learner, data)
    updates = optim.updates_per_rollout * optim.mini_batches
    per_mini = _micro_batches_per_mini_batch(config)
    if (optim.old_logprobs == "teacher_forced" or optim.rollout_correction != "none") and updates > 1:
        _teacher_forced_old(learner, data.context, plans)
    table = torch.zeros(updates, per_mini, len(UPDATE_COLUMNS), dtype=torch.float64, device=device)
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
    sums = table.sum(dim=1)  # [updates, columns]: each update's sums over its micro-batches
    means = sums.mean(dim=0)
    column = {name: index for index, name in enumerate(UPDATE_COLUMNS)}
    tokens = float(sums[:optim.mini_batches, column["tokens"]].sum())  # one pass over the rollout
    return {"loss": float(means[column["loss"]]), "kl": float(means[column["kl"]]),
            "clip_fraction": float(means[column["clip_fraction"]]),
            "clip_fraction_low": float(means[column["clip_fraction_low"]]),
            "clip_fraction_high": float(means[column["clip_fraction_high"]]),
            "entropy": float(sums[:, column["entropy_sum"]].sum() / sums[:, column["tokens"]].sum().clamp(min=1)),
            "rollout_logprob_gap": float(sums[:optim.mini_batches, column["gap_sum"]].sum()) / max(tokens, 1.0),
            "rollout_kl": float(sums[:optim.mini_batches, column["mismatch_kl_sum"]].sum()) / max(tokens, 1.0),
            "grad_norm": sum(norms) / len(norms), "learning_rate": learner.optimizer.param_groups[0]["lr"]}


def reference_logprobs(learner: Learner, context: StepContext, rollout: Rollout,
                       shares: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """``[n, T]`` log π_ref of this process's rows of ``rollout`` (0 on padding), through
    the update's micro-batches (every process makes the same passes; ``shares``: each
    process's step positions): for ``optim.kl_in: reward``, which needs them before the
    estimator. The update then reuses them (``StepData.reference``)."""
    batch = rollout.batch
    everything = torch.ones(batch.size, dtype=torch.bool)  # [n] (the weights are not read)
    positions = torch.tensor([shares[learner.accelerator.process_index][int(p)] for p in rollout.prompt_index])
    data = StepData(context, rollout, torch.zeros(batch.tokens.shape), everything, batch, positions, everything, shares)
    out = torch.zeros(batch.size, batch.width, dtype=torch.float32)
    for planned in _plans(learner, data):
        for micro in planned:
            _reference_pass(learner, micro, context.config.rollout.temperature)
            out[micro.rows, : micro.reference.shape[1]] = micro.reference.float().cpu()  # a stand-in: the same values
    return out


def _plans(learner: Learner, data: StepData) -> list[list[MicroBatch]]:
    """This process's micro-batches of every mini-batch of the step."""
    optim = data.context.config.optim
    data = StepData(data.context, data.rollout, data.advantages, data.kept.cpu(), data.whole, data.whole_positions,
                    data.whole_kept, data.shares, data.reference)
    return [plan_micro_batches(data, mini_batch_totals(data.whole.lengths, data.whole_positions, data.whole_kept,
                                                       mini, optim.mini_batches),
                               mini, learner.accelerator.process_index, learner.accelerator.device)
            for mini in range(optim.mini_batches)]


def _reference_pass(learner: Learner, micro: MicroBatch, temperature: float) -> None:
    """``micro.reference``: log π_ref of its rows (the adapter disabled), unless known."""
    if micro.reference is None:
        with torch.no_grad(), reference_policy(learner.policy):
            micro.reference = response_logprobs(learner.policy, micro.inputs, micro.tokens, micro.lengths,
                                                micro.prompt_index, temperature, shared_prefix=True)


def _backward(learner: Learner, context: StepContext, planned: list[MicroBatch], table: torch.Tensor,
              pass_number: int) -> None:
    """Forward and backward over ``planned`` (one update of pass ``pass_number``),
    gradients synchronised across processes at the last micro-batch; each micro-batch's
    own ``UPDATE_COLUMNS`` go into ``table`` ``[micro-batches, columns]`` at its number."""
    accelerator, config = learner.accelerator, context.config
    optim, temperature = config.optim, config.rollout.temperature
    settings = LossSettings.of(optim)
    correcting = optim.rollout_correction != "none"
    first_update = pass_number == 0
    for index, micro in enumerate(planned):
        if settings.needs_reference:  # no KL term anywhere: no reference pass
            _reference_pass(learner, micro, temperature)
        sync = (gradients_accumulated_locally(accelerator, learner.model) if index < len(planned) - 1
                else contextlib.nullcontext())  # DDP's no_sync, FSDP2's set_requires_gradient_sync(False)
        with sync:
            current, entropy = response_logprobs(learner.model, micro.inputs, micro.tokens, micro.lengths,
                                                 micro.prompt_index, temperature, shared_prefix=True,
                                                 dropout_keys=micro.dropout_keys(config.seed, context.step,
                                                                                 pass_number), entropy=True)
            trained_old = micro.old if micro.old is not None else current.detach()  # the trainer's log π at θ_old
            old = micro.rollout_logprobs if optim.old_logprobs == "rollout" and not correcting else trained_old
            correction = (correction_weights(trained_old, micro.rollout_logprobs, micro.mask, optim.rollout_correction,
                                             optim.rollout_correction_level, optim.rollout_correction_cap)
                          if correcting else None)
            loss = learner.compute_loss(
                context=context, logprobs=current, old_logprobs=old, reference_logprobs=micro.reference,
                advantages=micro.advantages, mask=micro.mask, weights=micro.weights, entropy=entropy,
                correction=correction,
            )
            accelerator.backward(loss.loss * accelerator.num_processes)  # DDP averages over processes
        counted = micro.mask & (micro.weights > 0)  # the response tokens this micro-batch trains (not a stand-in's)
        gap = (mismatch_sums(trained_old, micro.rollout_logprobs, counted) if first_update
               else torch.zeros(2, dtype=torch.float64, device=table.device))
        table[micro.number] += torch.stack([
            _scalar(loss.loss, table), _scalar(loss.kl, table), _scalar(loss.clip_fraction, table),
            _scalar(loss.clip_fraction_low, table), _scalar(loss.clip_fraction_high, table),
            (entropy.detach().double() * counted).sum(), counted.sum().double(), *gap,
        ]).to(table.device)


def _scalar(value: torch.Tensor | None, table: torch.Tensor) -> torch.Tensor:
    """A loss statistic as a float64 scalar on the table's device (0 where the loss gave none)."""
    return (torch.zeros((), dtype=table.dtype, device=table.device) if value is None
            else value.detach().to(device=table.device, dtype=table.dtype))


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


def _own_extent(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` of some prompts without the left padding that none of them needs
    (columns where every prompt is padding)."""
    real = inputs["attention_mask"].bool().any(dim=0)  # [L]
    start = int(real.int().argmax()) if bool(real.any()) else 0
    return {key: value[:, start:] if key in PROMPT_WIDE else value for key, value in inputs.items()}
