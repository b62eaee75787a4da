"""The task protocol: a speech dataset of spoken prompts and their references (what a
``register_tasks`` plugin registers, and what the hookspecs point to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Example", "Task", "SPLITS"]

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Example:
    """One spoken example. ``prompt`` holds the ``<|audio|>`` placeholder."""

    id: str
    audio: "np.ndarray"  # [S] float32 waveform at 16 kHz
    prompt: str
    reference: str
    duration: float  # seconds


@runtime_checkable
class Task(Protocol):
    """A registered task (``register_tasks``); the run's ``reward`` scores its responses
    against the examples' references."""

    def load(self, split: str) -> "list[Example] | Iterator[Example]":
        """Examples of ``split`` (one of ``SPLITS``). A task's options (``task.options``:
        local paths, hub id, limits) are its declared ``parameters``, given when it is
        built (``with_parameters``)."""
        ...
