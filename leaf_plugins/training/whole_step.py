"""One step on several processes: each process samples its share of the step's prompts,
and every process then sees the whole step.

* ``prompt_share``: process r samples a contiguous range of the step's prompts (the
  first ``prompts % world`` processes one more), so the processes' rows, concatenated
  in rank order, are the step's rows in the one-process order.
* ``check_world``: a process with no prompt is refused before any model loads.
* ``gather_rollout``: every process's rollout (tokens, lengths, group ids, the per-token
  fields the rollout has, its extra fields, the rewards, the texts) gathered onto every process, padded to the widest
  share's width: the batch one process would have sampled. The estimator runs on it on
  every process (an estimator that learns from the whole call, such as ``tree_otb``'s
  fitted weight or ``normalize: batch``, sees the same call on 1 or N processes), the
  metrics are the whole step's, and each process keeps its own rows for its loss.

With one process nothing is communicated: ``gather_rollout`` returns its input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

from leaf_plugins.core.batch import PAD_TOKEN, PER_TOKEN_FIELDS, RolloutBatch
from leaf_plugins.core.errors import ConfigError, LeafError
from leaf_plugins.core.stages import Rollout

__all__ = ["PROMPT_WIDE", "prompt_share", "micro_batch_numbers", "mini_batch_positions", "micro_batches_per_process",
           "check_world", "WholeStep", "gather_rollout", "RolloutGatherError"]

PROMPT_WIDE = ("input_ids", "attention_mask", "inputs_embeds")
"""The model inputs laid out along the prompt's (left-padded) positions: what a step's
passes read of its prompts (``inputs_embeds`` holds the audio)."""


def prompt_share(prompts: int, rank: int, world: int) -> range:
    """The step positions of the prompts process ``rank`` of ``world`` samples: a
    contiguous range, the first ``prompts % world`` ranges one longer."""
    base, extra = divmod(prompts, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def micro_batch_numbers(share: Iterable[int], micro_batch_prompts: int, mini_batches: int = 1) -> list[int]:
    """The micro-batch of each prompt of ``share`` (step positions) within its mini-batch.

    Mini-batch ``m`` of a pass holds the step's prompts at positions ``p ≡ m`` (mod
    ``mini_batches``), so every process with at least ``mini_batches`` prompts has some
    of each; its micro-batches are runs of ``micro_batch_prompts`` consecutive prompts of
    the mini-batch, numbered ``(p // mini_batches) // micro_batch_prompts`` and cut at the
    share's bounds. They are the same micro-batches on any number of processes wherever
    the bounds fall on a multiple of ``micro_batch_prompts × mini_batches``."""
    return [position // mini_batches // micro_batch_prompts for position in share]


def mini_batch_positions(share: range, mini_batch: int, mini_batches: int) -> list[int]:
    """The step positions of ``share`` that belong to mini-batch ``mini_batch``."""
    return [position for position in share if position % mini_batches == mini_batch]


def micro_batches_per_process(prompts_per_step: int, micro_batch_prompts: int, world: int, mini_batches: int,
                              mini_batch: int) -> int:
    """How many micro-batches every process runs in mini-batch ``mini_batch``: as many as
    the process with the most (at least one). A process with fewer runs stand-ins of
    weight 0 (``update.plan_micro_batches``), so that all make the same forward passes
    and collectives: under FSDP2 every forward pass gathers the sharded weights from
    all processes, and DDP's gradient all-reduce closes each update on all of them."""
    return max(max(len(set(micro_batch_numbers(mini_batch_positions(prompt_share(prompts_per_step, rank, world),
                                                                    mini_batch, mini_batches),
                                               micro_batch_prompts, mini_batches))), 1)
               for rank in range(world))


def check_world(prompts_per_step: int, world: int) -> None:
    """Refuse a run in which some process would get no prompt.

    :raises ConfigError: naming both numbers and what to change.
    """
    if prompts_per_step < world:
        raise ConfigError(
            f"rollout.prompts_per_step={prompts_per_step} is smaller than the {world} processes of this launch: "
            f"{world - prompts_per_step} of them would have no prompt to sample. Set rollout.prompts_per_step to at "
            f"least {world} (a multiple of {world} gives every process the same share), or launch at most "
            f"{prompts_per_step} processes")


@dataclass(frozen=True)
class WholeStep:
    """The step's rollout as one process would have it, and where each process's rows are."""

    rollout: Rollout  # every process's responses in rank order; prompt_index counts the step's prompts
    rewards: torch.Tensor  # [N] float32 (may hold the non-finite rewards the trainer then screens)
    rows: list[range]  # the whole rollout's rows of each process (rank r's: rows[r])
    columns: torch.Tensor | None = None  # [N, C] float32 further values per response, gathered with the rewards


def gather_rollout(rollout: Rollout, rewards: torch.Tensor, share: range, device: torch.device,
                   step: int = 0, columns: torch.Tensor | None = None) -> WholeStep:
    """Gather every process's rollout of the step (``share``: this process's prompt
    positions) onto every process, over the default process group; ``device``: the one
    the process group communicates on (CUDA for NCCL). Three collectives: a header (each
    process's shape, per-token fields, group ids and texts), then one integer and one
    float table, each the same call on every process whatever it sampled. ``columns``
    ``[n, C]``: further float values per response gathered in the float table (the
    configured rewards' scores, a KL penalty).

    :raises RolloutGatherError: on every process alike, when the processes' rollouts
        cannot form one step: a group id sampled by two processes (a rollout plugin that
        numbers its groups 0…P−1 on each process would merge different prompts' groups),
        or different per-token fields (a backend that computes a statistic on one process
        only). ``step`` (1-based) is named in the message.
    """
    batch = rollout.batch
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if columns is None:
        columns = torch.zeros(batch.size, 0)
    if world == 1:
        return WholeStep(rollout, rewards, [range(batch.size)], columns.to(torch.float32))
    fields = [name for name in PER_TOKEN_FIELDS if getattr(batch, name) is not None]
    fields += sorted(batch.extra)  # a backend's or plugin's own per-token fields
    header = {"size": batch.size, "width": batch.width, "fields": fields,
              "groups": sorted(set(batch.group_ids.tolist())), "texts": list(rollout.texts)}
    headers: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(headers, header)
    _check_headers(headers, step)
    sizes = [(h["size"], h["width"]) for h in headers]
    rows, width = max(n for n, _ in sizes), max(t for _, t in sizes)

    integers = torch.full((rows, width + 3), PAD_TOKEN, dtype=torch.int64, device=device)  # tokens | length, id, prompt
    integers[: batch.size, : batch.width] = batch.tokens.to(device)
    integers[: batch.size, width] = batch.lengths.to(device)
    integers[: batch.size, width + 1] = batch.group_ids.to(device)
    integers[: batch.size, width + 2] = rollout.prompt_index.to(device) + share.start
    extra_columns = columns.shape[1]
    floats = torch.zeros(rows, 1 + extra_columns + len(fields) * width, dtype=torch.float32,
                         device=device)  # reward | columns | fields
    floats[: batch.size, 0] = rewards.to(device=device, dtype=torch.float32)
    floats[: batch.size, 1 : 1 + extra_columns] = columns.to(device=device, dtype=torch.float32)
    first = 1 + extra_columns
    for number, name in enumerate(fields):
        floats[: batch.size, first + number * width : first + number * width + batch.width] = \
            batch.token_field(name).to(device)
    gathered_integers = [torch.empty_like(integers) for _ in range(world)]
    gathered_floats = [torch.empty_like(floats) for _ in range(world)]
    dist.all_gather(gathered_integers, integers)
    dist.all_gather(gathered_floats, floats)

    home = batch.tokens.device
    integers = torch.cat([block[:n] for block, (n, _) in zip(gathered_integers, sizes)]).to(home)  # [N, width + 3]
    floats = torch.cat([block[:n] for block, (n, _) in zip(gathered_floats, sizes)]).to(home)  # [N, 1 + C + F·w]
    per_token = {name: floats[:, first + number * width : first + (number + 1) * width].contiguous()
                 for number, name in enumerate(fields)}
    whole = RolloutBatch(tokens=integers[:, :width].contiguous(), lengths=integers[:, width].contiguous(),
                         group_ids=integers[:, width + 1].contiguous(), rewards=torch.zeros_like(floats[:, 0]),
                         vocab_size=batch.vocab_size,
                         **{name: value for name, value in per_token.items() if name in PER_TOKEN_FIELDS},
                         extra={name: value for name, value in per_token.items() if name not in PER_TOKEN_FIELDS})
    starts = torch.tensor([0] + [n for n, _ in sizes]).cumsum(0).tolist()
    return WholeStep(
        Rollout(batch=whole, prompt_index=integers[:, width + 2].contiguous(),
                texts=[text for h in headers for text in h["texts"]]),
        floats[:, 0].contiguous(),
        [range(starts[r], starts[r + 1]) for r in range(world)],
        floats[:, 1:first].contiguous(),
    )


def _check_headers(headers: list[dict], step: int) -> None:
    """Refuse rollouts of the processes that cannot form one step (``gather_rollout``)."""
    where = f"step {step}: " if step else ""
    for rank, header in enumerate(headers[1:], start=1):
        if header["fields"] != headers[0]["fields"]:
            raise RolloutGatherError(
                f"{where}the processes' rollouts have different per-token fields: process 0's has "
                f"{', '.join(headers[0]['fields']) or 'none'}, process {rank}'s {', '.join(header['fields']) or 'none'}. "
                f"Every process must compute the same fields (a rollout backend or plugin that adds a field adds it "
                f"on every process, for every step)")
    owner: dict[int, int] = {}
    for rank, header in enumerate(headers):
        for group in header["groups"]:
            if group in owner:
                raise RolloutGatherError(
                    f"{where}group id {group} was sampled by process {owner[group]} and by process {rank}: the "
                    f"processes' rollouts would merge different prompts into one group. A rollout plugin numbers "
                    f"its groups as the step's prompts (StepContext.group_ids), not from 0 on each process")
            owner[group] = rank


class RolloutGatherError(LeafError):
    """The processes' rollouts of a step cannot be gathered into one step."""
