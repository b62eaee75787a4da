"""Rollout logs: JSONL, one rollout group per line; writer, streaming reader, observer.
A training run writes one (``log_rollouts: true``), the forkability analysis reads it.

A line holds ``step`` (int), ``group_id`` (int), ``prompt_id`` (int or str), ``tokens``
(list of K token-id lists), ``rewards`` (K floats), ``surprisal`` (K lists, one value
per token) and optionally ``texts`` (K strings), ``boundaries`` (the positions the
logging run's estimator selected) and ``estimator`` (its name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.jsonl import read_jsonl
from leaf_plugins.core.tree import EstimateResult

__all__ = ["LoggedGroup", "group_records", "write_groups", "read_groups", "batches_from_groups", "RolloutLogger"]

REQUIRED = ("step", "group_id", "prompt_id", "tokens", "rewards", "surprisal")


@dataclass(frozen=True)
class LoggedGroup:
    """One logged rollout group (K responses to one prompt)."""

    step: int
    group_id: int
    prompt_id: int | str
    tokens: list[list[int]]
    rewards: list[float]
    surprisal: list[list[float]]
    texts: list[str] | None = None
    boundaries: list[int] | None = None
    estimator: str | None = None

    def record(self) -> dict:
        """The JSON object of this group (optional keys only when set)."""
        out = {"step": self.step, "group_id": self.group_id, "prompt_id": self.prompt_id, "tokens": self.tokens,
               "rewards": self.rewards, "surprisal": self.surprisal}
        for key in ("texts", "boundaries", "estimator"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def group_records(
    batch: RolloutBatch,
    step: int,
    result: EstimateResult | None = None,
    prompt_ids: Sequence[int | str] | None = None,
    texts: Sequence[str] | None = None,
) -> list[LoggedGroup]:
    """The groups of ``batch`` (groups in ascending group id), ready to write.

    :param prompt_ids: one per group; defaults to the batch's group ids.
    :param texts: one per response (batch order), optional.
    """
    if batch.surprisal is None:
        raise ConfigError("cannot log rollouts without surprisal: the batch has none")
    layout = batch.groups
    order = torch.argsort(layout.index, stable=True).tolist()  # responses grouped, batch order within
    tokens, lengths = batch.tokens.tolist(), batch.lengths.tolist()
    rewards, surprisal = batch.rewards.tolist(), batch.surprisal.tolist()
    ids = layout.ids.tolist()
    boundaries = result.boundaries if result is not None else None
    if prompt_ids is not None and len(prompt_ids) != len(ids):
        raise ValueError(f"{len(prompt_ids)} prompt ids for {len(ids)} groups")
    groups, start = [], 0
    for number, size in enumerate(layout.sizes.tolist()):
        rows = order[start : start + size]
        start += size
        groups.append(LoggedGroup(
            step=step,
            group_id=ids[number],
            prompt_id=prompt_ids[number] if prompt_ids is not None else ids[number],
            tokens=[tokens[i][: lengths[i]] for i in rows],
            rewards=[rewards[i] for i in rows],
            surprisal=[surprisal[i][: lengths[i]] for i in rows],
            texts=[texts[i] for i in rows] if texts is not None else None,
            boundaries=boundaries[number] if boundaries is not None else None,
            estimator=result.estimator if result is not None else None,
        ))
    return groups


def write_groups(handle: IO[str], groups: Iterable[LoggedGroup]) -> int:
    """Append ``groups`` to an open text file, one JSON line each; returns the count."""
    count = 0
    for group in groups:
        handle.write(json.dumps(group.record(), separators=(",", ":")) + "\n")
        count += 1
    handle.flush()
    return count


def read_groups(path: str | Path) -> Iterator[LoggedGroup]:
    """Stream the groups of a rollout log, checking every line; errors name file:line."""
    for number, record in read_jsonl(path, "rollout log"):
        yield _group(record, f"{path}:{number}")


def _group(record: object, where: str) -> LoggedGroup:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r} (a line needs {', '.join(REQUIRED)})")
    tokens, rewards, surprisal = record["tokens"], record["rewards"], record["surprisal"]
    if not isinstance(tokens, list) or not tokens or not all(isinstance(row, list) for row in tokens):
        raise ConfigError(f"{where}: 'tokens' must be a non-empty list of token-id lists")
    for key, value in (("rewards", rewards), ("surprisal", surprisal)):
        if not isinstance(value, list) or len(value) != len(tokens):
            raise ConfigError(f"{where}: {key!r} must hold one entry per response ({len(tokens)})")
    for i, (row, values) in enumerate(zip(tokens, surprisal)):
        if not isinstance(values, list) or len(values) != len(row):
            raise ConfigError(f"{where}: surprisal[{i}] has {len(values) if isinstance(values, list) else 'no'} "
                              f"values for a response of {len(row)} tokens")
        if any(not isinstance(t, int) or t < 0 for t in row):
            raise ConfigError(f"{where}: tokens[{i}] must hold non-negative integers")
    texts = record.get("texts")
    if texts is not None and (not isinstance(texts, list) or len(texts) != len(tokens)):
        raise ConfigError(f"{where}: 'texts' must hold one string per response ({len(tokens)})")
    return LoggedGroup(int(record["step"]), int(record["group_id"]), record["prompt_id"], tokens,
                       [float(r) for r in rewards], surprisal, texts, record.get("boundaries"), record.get("estimator"))


def batches_from_groups(
    groups: Iterable[LoggedGroup], groups_per_batch: int = 256
) -> Iterator[tuple[RolloutBatch, list[LoggedGroup]]]:
    """Pack groups into batches of up to ``groups_per_batch`` groups (group ids 0 … in
    the batch follow the list order), each with the groups it holds."""
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
    pending: list[LoggedGroup] = []
    for group in groups:
        pending.append(group)
        if len(pending) == groups_per_batch:
            yield _batch(pending), pending
            pending = []
    if pending:
        yield _batch(pending), pending


def _batch(groups: list[LoggedGroup]) -> RolloutBatch:
    tokens = [row for group in groups for row in group.tokens]
    rewards = [r for group in groups for r in group.rewards]
    surprisal = [row for group in groups for row in group.surprisal]
    ids = [number for number, group in enumerate(groups) for _ in group.tokens]
    return RolloutBatch.from_lists(tokens, rewards, ids, surprisal=surprisal)


class RolloutLogger:
    """Observer plugin that appends every estimated batch's groups to a JSONL log.

    Register it on the per-run engine: ``Engine(..., observers=[RolloutLogger(path)])``.
    ``step`` starts at ``step`` and counts ``on_estimate`` calls; a trainer that estimates
    once per optimizer step may also set ``logger.step`` itself before each step.
    """

    def __init__(self, path: str | Path, step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.step = step
        self.groups_written = 0

    @hookimpl
    def on_estimate(self, batch: RolloutBatch, result: EstimateResult) -> None:
        groups = group_records(batch, self.step, result)
        with self.path.open("a") as handle:
            self.groups_written += write_groups(handle, groups)
        self.step += 1
