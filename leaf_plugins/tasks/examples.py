"""Rows parsed from a source (``Record``), the paper's filters applied to them, and the
lazy list of ``Example`` a task returns (audio is read when an example is accessed)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence, overload

import numpy as np

from leaf_plugins.core.task import Example
from leaf_plugins.tasks.audio import SAMPLING_RATE
from leaf_plugins.tasks.filters import is_multiple_choice

__all__ = ["AudioSource", "Record", "ExampleList", "apply_filters", "UniqueIds"]

log = logging.getLogger(__name__)


class AudioSource(Protocol):
    """Where a record's audio comes from."""

    def read(self) -> np.ndarray:
        """[S] float32 at 16 kHz."""
        ...

    def seconds(self) -> float:
        """Duration in seconds (from a header where possible)."""
        ...


@dataclass(frozen=True)
class Record:
    """One parsed row: the text of an example and where its audio is."""

    id: str
    prompt: str  # with <|audio|>
    reference: str
    audio: AudioSource
    where: str  # file and row, for messages
    duration: float | None = None  # as declared by the source
    question: str = ""


@dataclass
class ExampleList(Sequence[Example]):
    """The examples of one split; audio is read (and resampled) when an item is accessed.
    ``filtered`` counts the rows the filters removed, by reason."""

    records: list[Record]
    filtered: dict[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def filtered_total(self) -> int:
        """How many rows the filters removed."""
        return sum(self.filtered.values())

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Example: ...

    @overload
    def __getitem__(self, index: slice) -> list[Example]: ...

    def __getitem__(self, index: int | slice) -> Example | list[Example]:
        if isinstance(index, slice):
            return [self._example(record) for record in self.records[index]]
        return self._example(self.records[index])

    @staticmethod
    def _example(record: Record) -> Example:
        wave = record.audio.read()  # [S] float32, 16 kHz
        return Example(record.id, wave, record.prompt, record.reference, len(wave) / SAMPLING_RATE)


def apply_filters(records: Iterable[Record], max_duration: float | None, drop_multiple_choice: bool,
                  label: str) -> tuple[list[Record], dict[str, int]]:
    """``records`` without clips longer than ``max_duration`` seconds (the declared duration,
    else the file header's) and, if asked, multiple-choice items; with counts by reason.
    The counts are logged under ``label``."""
    kept, removed = [], Counter()
    for record in records:
        if drop_multiple_choice and is_multiple_choice(record.question, record.reference):
            removed["multiple choice"] += 1
            continue
        if max_duration is not None:
            seconds = record.duration if record.duration is not None else record.audio.seconds()
            if seconds > max_duration:
                removed[f"longer than {max_duration:g} s"] += 1
                continue
        kept.append(record)
    log.info("%s: %d examples kept, %d rows filtered %s", label, len(kept), sum(removed.values()), dict(removed))
    return kept, dict(removed)


class UniqueIds:
    """Makes ids unique: the n-th repeat (n >= 2) of ``x`` becomes ``x-n``."""

    def __init__(self) -> None:
        self._seen: Counter[str] = Counter()

    def __call__(self, candidate: str) -> str:
        self._seen[candidate] += 1
        count = self._seen[candidate]
        return candidate if count == 1 else f"{candidate}-{count}"
