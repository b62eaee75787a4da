"""Held-out splits for sources without one: a deterministic fraction by stable hash."""

from __future__ import annotations

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.task import SPLITS
from leaf_plugins.tasks.prompts import stable_fraction

__all__ = ["held_out_split", "check_split", "check_fraction", "check_fractions"]


def held_out_split(key: str, validation_fraction: float, test_fraction: float = 0.0) -> str:
    """The split of the item keyed by ``key`` (its audio clip, so that all questions about
    one clip land together): ``test`` if its stable hash is below ``test_fraction``,
    ``validation`` below ``test_fraction + validation_fraction``, else ``train``."""
    fraction = stable_fraction("split:" + key)
    if fraction < test_fraction:
        return "test"
    if fraction < test_fraction + validation_fraction:
        return "validation"
    return "train"


def check_split(task: str, split: str) -> None:
    """Raise a ``ConfigError`` for an unknown split name."""
    if split not in SPLITS:
        raise ConfigError(f"task {task!r} has no split {split!r}; splits: {', '.join(SPLITS)}")


def check_fraction(name: str, value: float) -> None:
    """Raise a ``ValueError`` naming parameter ``name`` unless ``value`` is in [0, 1)
    (a check of a task's parameters dataclass)."""
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def check_fractions(task: str, **fractions: float) -> None:
    """Raise a ``ConfigError`` unless the held-out fractions (each in [0, 1)) sum below 1."""
    if sum(fractions.values()) >= 1:
        raise ConfigError(f"task {task!r}: {' + '.join(fractions)} must be below 1, got {sum(fractions.values())}")
