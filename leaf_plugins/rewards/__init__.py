"""Built-in rewards: ``sentence_bleu``, ``sentence_bleu_lowercase`` and ``exact_match``.

A reward is ``reward(predictions: list[str], references: list[str]) -> list[float]``,
registered through the ``register_rewards`` hook.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

from sacrebleu.metrics import BLEU

from leaf_plugins.core.hookspecs import hookimpl

__all__ = ["SentenceBLEU", "exact_match", "normalise_text"]


class SentenceBLEU:
    """Sentence BLEU (sacrebleu, effective order) / 100, in [0, 1]."""

    def __init__(self, lowercase: bool = False) -> None:
        self.lowercase = lowercase
        self.__doc__ = f"Sentence BLEU (sacrebleu, effective order, {'lowercased' if lowercase else 'case-sensitive'}) / 100."
        self._metric = BLEU(lowercase=lowercase, effective_order=True)

    def __call__(self, predictions: list[str], references: list[str]) -> list[float]:
        _check_lengths(predictions, references)
        return [self._metric.sentence_score(p, [r]).score / 100 for p, r in zip(predictions, references)]


def normalise_text(text: str) -> str:
    """Unicode-normalise (NFKC), lowercase, turn punctuation into spaces, collapse spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def exact_match(predictions: list[str], references: list[str]) -> list[float]:
    """1.0 where the prediction equals the reference after ``normalise_text``, else 0.0."""
    _check_lengths(predictions, references)
    return [float(normalise_text(p) == normalise_text(r)) for p, r in zip(predictions, references)]


def _check_lengths(predictions: list[str], references: list[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")


@hookimpl
def register_rewards(register: Callable[[str, object], None]) -> None:
    register("sentence_bleu", SentenceBLEU())
    register("sentence_bleu_lowercase", SentenceBLEU(lowercase=True))
    register("exact_match", exact_match)
