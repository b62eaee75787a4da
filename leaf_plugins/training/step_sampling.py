"""Sampling a training step: one round of ``rollout.prompts_per_step`` prompts, or, with
``rollout.dynamic_sampling`` (DAPO's), rounds until the step has that many informative
groups; then the step as every process trains it.

A round samples and scores its prompts on every process (each its share, keyed as
always: ``StepContext.group_ids`` numbers round r's groups after round r − 1's), then
gathers them (``whole_step.gather_rollout``), so every process sees every group of the
round and takes the same decisions: which groups have a non-finite reward
(``nonfinite_rewards``), which are informative (the scorer's rewards not all equal, as
DAPO filters on accuracy, before any penalty), whether another round is needed. Round
r ≥ 1 draws its prompts with a generator keyed by the run's seed, the step and r, so N
processes sample what one samples and a resumed run samples what an uninterrupted one
did.

The step is the first ``prompts_per_step`` informative groups in round order; when
``rollout.max_sampling_rounds`` rounds leave fewer, the remaining groups with finite
rewards fill it in round order. Without dynamic sampling the step is the one round as
sampled (a group with a non-finite reward stays, with weight 0, under ``drop_group``).
Each process then trains the rows it sampled of the chosen groups (``AssembledStep``);
their step positions (0 … the step's groups − 1, in the order chosen) decide the
mini-batches, as the prompts' positions do in a step of one round.

The rewards the estimator sees are the scores the run's scorer gave, plus DAPO's overlong
penalty (``rollout.overlong: penalty``) and minus ``β`` times each response's summed KL
to π_ref (``optim.kl_in: reward``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

import torch

from leaf_plugins.core.batch import PAD_TOKEN, RolloutBatch
from leaf_plugins.core.processes import agreed_interrupt_point
from leaf_plugins.core.stages import Rollout, StepContext
from leaf_plugins.core.task import Example
from leaf_plugins.training.finite import bad_reward_prompts
from leaf_plugins.training.loss import LossSettings, kl_estimate
from leaf_plugins.training.overlong import overlong_buffer, overlong_penalty, truncated
from leaf_plugins.training.whole_step import PROMPT_WIDE, WholeStep, gather_rollout, prompt_share

__all__ = ["SampledRound", "AssembledStep", "sample_round", "choose_groups", "assemble_step",
           "round_seed"]



@dataclass
class SampledRound:
    """One round of a step: its prompts, this process's rollout of its share, and the
    whole round gathered (rewards as the estimator sees them)."""

    number: int
    examples: list[Example]  # the round's prompts, in step order
    context: StepContext  # this process's share
    rollout: Rollout  # this process's responses
    whole: WholeStep  # every process's, in rank order
    scores: torch.Tensor  # [N] the scorer's rewards (before penalties)
    parts: torch.Tensor  # [N, R] each configured reward's scores
    kl: torch.Tensor | None  # [N] each response's summed KL to π_ref (optim.kl_in: reward)
    reference: torch.Tensor | None  # [n, T] log π_ref of this process's rows (optim.kl_in: reward)
    dropped: list[int]  # the round's prompt positions with a non-finite reward (drop_group)

    @cached_property
    def informative(self) -> tuple[int, ...]:
        """The round's prompt positions whose scores (the scorer's rewards, before an
        overlong penalty or a KL is subtracted: those vary with every response and would
        make every group look informative) are not all equal and all finite."""
        positions = self.whole.rollout.prompt_index.to(self.scores.device)  # [N]
        prompts = len(self.examples)
        finite = torch.isfinite(self.scores)  # [N]
        values = torch.where(finite, self.scores, torch.zeros_like(self.scores))
        low = torch.full((prompts,), float("inf"), dtype=values.dtype, device=values.device)
        low = low.scatter_reduce(0, positions, values, "amin")  # [P]
        high = torch.full_like(low, float("-inf")).scatter_reduce(0, positions, values, "amax")  # [P]
        responses = torch.bincount(positions, minlength=prompts)  # [P]
        all_finite = torch.bincount(positions, weights=finite.to(torch.float64), minlength=prompts) == responses
        varied = (responses > 0) & all_finite & (high > low)  # [P]
        return tuple(position for position in varied.nonzero().squeeze(1).tolist() if position not in self.dropped)


@dataclass
class AssembledStep:
    """The step as it trains: every process's chosen groups, and this process's part."""

    context: StepContext  # this process's chosen prompts (their inputs' rows in step order)
    rollout: Rollout  # this process's rows of them (prompt_index: rows of context.inputs)
    whole: RolloutBatch  # every chosen group's rows, rewards as the estimator sees them
    positions: torch.Tensor  # [N] each row's step position
    estimated: torch.Tensor  # [N] bool, the rows the estimator sees (no non-finite reward in their group)
    trained: torch.Tensor  # [N] bool, the rows that train (estimated, and not masked as overlong)
    own: torch.Tensor  # [n] the rows of ``whole`` that are this process's, in its order
    shares: tuple[tuple[int, ...], ...]  # each process's step positions
    scores: torch.Tensor  # [N] the scorer's rewards
    parts: torch.Tensor  # [N, R]
    penalties: torch.Tensor  # [N] what was added to the scores (overlong penalty, minus β·KL)
    truncated: torch.Tensor  # [N] bool
    reference: torch.Tensor | None  # [n, T] log π_ref of this process's rows, where computed
    rounds: int  # rounds sampled
    groups_sampled: int  # groups sampled in every round
    zero_std_groups: int  # of them, groups whose rewards were all equal
    dropped: int  # groups with a non-finite reward (every round)


def round_seed(seed: int, step: int, number: int) -> int:
    """The seed of round ``number``'s prompt draw (rounds after the first) at ``step``."""
    return (seed * 1_000_003 + step * 7_919 + number * 104_729) % (1 << 62)


def sample_round(number: int, examples: list[Example], context_of: Callable[[list[Example], range, int], StepContext],
                 run: Any, rank: int, world: int, device: torch.device) -> SampledRound:
    """Sample, score and gather round ``number`` of the step on ``examples``.

    :param context_of: this process's step context of its share (examples, their range
        in the round, the round's number): inputs built and embedded.
    :param run: what the round needs of the trainer: ``hook`` (the run's hooks), ``model``
        (as the trainer wraps it), ``rewards`` (``RunRewards``), ``config``, ``eos_token_id``,
        ``reference(context, rollout, shares)`` (log π_ref of this process's rows).
    """
    from leaf_plugins.rollout.generation_weights import gathered_for_generation

    config = run.config
    share = prompt_share(len(examples), rank, world)
    context = context_of(examples[share.start : share.stop], share, number)
    run.model.eval()
    with gathered_for_generation(run.model):  # FSDP2: weights gathered once, not per token and layer
        rollout = run.hook.rollout(context=context)
    scores = run.hook.score_rollouts(context=context, rollout=rollout)
    parts = torch.stack([part.to(torch.float32) for part in run.rewards.scores(rollout, context.examples).values()],
                        dim=1)  # [n, R]
    reference = kl = None
    if LossSettings.of(config.optim).kl_in_reward:
        shares = tuple(tuple(prompt_share(len(examples), r, world)) for r in range(world))
        reference = run.reference(context, rollout, shares)  # [n, T]
        batch = rollout.batch
        kl = (kl_estimate(batch.logprobs.float().cpu(), reference[:, : batch.width], config.optim.kl_estimator)
              * batch.mask.cpu()).sum(dim=1)  # [n] each response's summed KL of π_old to π_ref
    agreed_interrupt_point()  # the safe point inside the step: nothing of it is trained yet
    columns = torch.cat([parts, *([kl.unsqueeze(1)] if kl is not None else [])], dim=1)  # [n, R (+ 1)]
    whole = gather_rollout(rollout, scores, share, device, context.step, columns)
    count = parts.shape[1]
    dropped = bad_reward_prompts(whole.rewards, whole.rollout, examples, context.step, config.nonfinite_rewards,
                                 run.scorer)
    scores_whole = whole.rewards
    adjusted = scores_whole.clone()
    batch = whole.rollout.batch
    if config.rollout.overlong == "penalty":
        adjusted = adjusted + overlong_penalty(batch.lengths.cpu(), config.rollout.max_new_tokens,
                                               overlong_buffer(config.rollout.max_new_tokens,
                                                               config.rollout.overlong_buffer),
                                               config.rollout.overlong_penalty_factor).to(adjusted.device)
    kl_whole = whole.columns[:, count] if kl is not None else None
    if kl_whole is not None:
        adjusted = adjusted - config.optim.kl_coefficient * kl_whole
    whole = WholeStep(whole.rollout, adjusted, whole.rows, whole.columns)
    return SampledRound(number, examples, context, rollout, whole, scores_whole, whole.columns[:, :count], kl_whole,
                        reference, dropped)


def choose_groups(rounds: Sequence[SampledRound], wanted: int, last_round: bool) -> list[tuple[int, int]] | None:
    """``(round, prompt position)`` of the step's groups: the first ``wanted`` informative
    ones in round order, or, after the last round, those and then the other groups with
    finite rewards up to ``wanted``. None: another round is needed."""
    informative = [(sampled.number, position) for sampled in rounds for position in sampled.informative]
    if len(informative) >= wanted:
        return informative[:wanted]
    if not last_round:
        return None
    chosen = set(informative)
    rest = [(sampled.number, position) for sampled in rounds for position in range(len(sampled.examples))
            if (sampled.number, position) not in chosen and position not in sampled.dropped]
    picked = set(informative + rest[: wanted - len(informative)])
    return [(sampled.number, position) for sampled in rounds for position in range(len(sampled.examples))
            if (sampled.number, position) in picked]  # in round order


def assemble_step(rounds: Sequence[SampledRound], chosen: list[tuple[int, int]] | None, rank: int, world: int,
                  config: Any, eos_token_id: int, pad_token_id: int) -> AssembledStep:
    """The step of the ``chosen`` groups (None: the one round as sampled, every group)."""
    sampled_groups = sum(len(sampled.examples) for sampled in rounds)
    zero_std = sum(len(sampled.examples) - len(sampled.informative) - len(sampled.dropped)
                   for sampled in rounds)
    dropped = sum(len(sampled.dropped) for sampled in rounds)
    if chosen is None or chosen == [(0, position) for position in range(len(rounds[0].examples))]:
        return _one_round(rounds[0], rank, world, config, eos_token_id, len(rounds), sampled_groups, zero_std, dropped)
    whole_rows, own_parts, positions, shares = [], [], [], [[] for _ in range(world)]
    for step_position, (number, position) in enumerate(chosen):
        sampled = rounds[number]
        rows = (sampled.whole.rollout.prompt_index == position).nonzero().squeeze(1)  # [K]
        whole_rows.append((number, rows))
        positions.append(torch.full((rows.numel(),), step_position, dtype=torch.int64))
        owner = next(r for r in range(world) if position in prompt_share(len(sampled.examples), r, world))
        shares[owner].append(step_position)
        if owner == rank:
            own_parts.append((number, position))
    whole = _concatenated([rounds[number].whole.rollout.batch.with_rewards(rounds[number].whole.rewards).select(rows)
                           for number, rows in whole_rows])
    scores = torch.cat([rounds[number].scores[rows] for number, rows in whole_rows])
    parts = torch.cat([rounds[number].parts[rows] for number, rows in whole_rows])
    penalties = whole.rewards - scores
    step_positions = torch.cat(positions)
    own_rows = torch.cat([torch.nonzero(step_positions == p).squeeze(1) for p in shares[rank]]) \
        if shares[rank] else torch.zeros(0, dtype=torch.int64)
    context, rollout, reference = _own_part(rounds, own_parts, rank, world, pad_token_id)
    cut = truncated(whole.tokens.cpu(), whole.lengths.cpu(), config.rollout.max_new_tokens, eos_token_id)
    estimated = torch.ones(whole.size, dtype=torch.bool)
    trained = estimated & ~cut if config.rollout.overlong == "mask" else estimated
    return AssembledStep(context, rollout, whole, step_positions, estimated, trained, own_rows,
                         tuple(tuple(share) for share in shares), scores, parts, penalties, cut, reference,
                         len(rounds), sampled_groups, zero_std, dropped)


def _one_round(sampled: SampledRound, rank: int, world: int, config: Any, eos_token_id: int, rounds: int,
               sampled_groups: int, zero_std: int, dropped: int) -> AssembledStep:
    """The step of one round, every group as sampled (its own rows and inputs as they are)."""
    positions = sampled.whole.rollout.prompt_index
    estimated = ~torch.isin(positions.cpu(), torch.tensor(sampled.dropped, dtype=torch.int64))  # [N]
    # [N] a dropped group's rewards (non-finite) as 0: the estimator never sees them
    rewards = torch.where(estimated.to(sampled.whole.rewards.device), sampled.whole.rewards, 0.0)
    whole = sampled.whole.rollout.batch.with_rewards(rewards)
    cut = truncated(whole.tokens.cpu(), whole.lengths.cpu(), config.rollout.max_new_tokens, eos_token_id)
    trained = estimated & ~cut if config.rollout.overlong == "mask" else estimated
    own = sampled.whole.rows[rank]
    shares = tuple(tuple(prompt_share(len(sampled.examples), r, world)) for r in range(world))
    penalties = sampled.whole.rewards - sampled.scores
    return AssembledStep(sampled.context, sampled.rollout, whole, positions, estimated, trained,
                         torch.arange(own.start, own.stop), shares, sampled.scores, sampled.parts, penalties, cut,
                         sampled.reference, rounds, sampled_groups, zero_std, dropped)


def _own_part(rounds: Sequence[SampledRound], chosen: list[tuple[int, int]], rank: int, world: int,
              pad_token_id: int) -> tuple[StepContext, Rollout, torch.Tensor | None]:
    """This process's chosen groups (``(round, prompt position)``, in step order) as one
    context (their examples and prompt-wide inputs, left padded to a common width), one
    rollout (``prompt_index`` counting them) and their reference log-probs."""
    first = rounds[0].context
    examples, inputs, rows, prompt_index, references = [], [], [], [], []
    for local, (number, position) in enumerate(chosen):
        sampled = rounds[number]
        start = prompt_share(len(sampled.examples), rank, world).start
        index = position - start  # the prompt's row in this process's share of the round
        examples.append(sampled.context.examples[index])
        inputs.append({key: sampled.context.inputs[key][index : index + 1] for key in PROMPT_WIDE
                       if key in sampled.context.inputs})
        mine = (sampled.rollout.prompt_index == index).nonzero().squeeze(1)
        rows.append((number, mine))
        prompt_index.append(torch.full((mine.numel(),), local, dtype=torch.int64))
        if sampled.reference is not None:
            references.append(sampled.reference[mine])
    batch = _concatenated([rounds[number].rollout.batch.select(mine) for number, mine in rows]) if rows else \
        rounds[0].rollout.batch.select(torch.zeros(0, dtype=torch.int64))
    texts = [rounds[number].rollout.texts[row] for number, mine in rows for row in mine.tolist()]
    rollout = Rollout(batch, torch.cat(prompt_index) if prompt_index else torch.zeros(0, dtype=torch.int64), texts)
    context = StepContext(first.step, first.model, first.loaded, examples, _left_padded(inputs, pad_token_id),
                          first.config, rewards=first.rewards)
    reference = _padded_rows(references, batch.width) if references else None
    return context, rollout, reference


def _concatenated(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """The rows of ``batches`` one after another, padded to the widest."""
    width = max(batch.width for batch in batches)

    def padded(value: torch.Tensor | None, fill: float) -> torch.Tensor | None:
        return None if value is None else torch.nn.functional.pad(value, (0, width - value.shape[1]), value=fill)

    fields = {name: [padded(getattr(batch, name), 0.0) for batch in batches]
              for name in ("surprisal", "logprobs", "sum_pi_squared")}
    return RolloutBatch(
        tokens=torch.cat([padded(batch.tokens, PAD_TOKEN) for batch in batches]),
        lengths=torch.cat([batch.lengths for batch in batches]),
        group_ids=torch.cat([batch.group_ids for batch in batches]),
        rewards=torch.cat([batch.rewards for batch in batches]),
        vocab_size=batches[0].vocab_size,
        **{name: None if values[0] is None else torch.cat(values) for name, values in fields.items()},
        extra={name: torch.cat([padded(batch.extra[name], 0.0) for batch in batches]) for name in batches[0].extra},
    )


def _left_padded(inputs: Sequence[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """One row per prompt of ``inputs`` (each ``[1, L_i, ...]``), left padded to the widest."""
    if not inputs:
        return {}
    width = max(part["attention_mask"].shape[1] for part in inputs)
    fills = {"input_ids": pad_token_id, "attention_mask": 0, "inputs_embeds": 0.0}
    out = {}
    for key in inputs[0]:
        rows = []
        for part in inputs:
            value = part[key]
            missing = width - value.shape[1]
            pad = torch.full((1, missing, *value.shape[2:]), fills[key], dtype=value.dtype, device=value.device)
            rows.append(torch.cat([pad, value], dim=1))
        out[key] = torch.cat(rows)  # [P, L, ...]
    return out


def _padded_rows(parts: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """``[n, width]`` rows of ``parts`` (each ``[k, w_i]``), zero padded on the right."""
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1])) if part.shape[1] < width
                      else part[:, :width] for part in parts])
