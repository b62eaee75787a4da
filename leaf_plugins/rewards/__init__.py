"""Built-in rewards: ``sentence_bleu``, ``sentence_bleu_lowercase`` and ``exact_match``.

A reward is ``reward(predictions: list[str], references: list[str]) -> list[float]``,
registered through the ``register_rewards`` hook. One with parameters declares them with
``@parameterised(Params)`` (a dataclass): a class then takes the ``Params`` instance as
its one argument (``SentenceBLEU``), a function as its ``params`` keyword; a run builds
it with ``reward_params``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Literal

from sacrebleu.metrics import BLEU

from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.parameters import parameterised

__all__ = ["BLEUParams", "LowercaseBLEUParams", "SentenceBLEU", "LowercaseSentenceBLEU", "exact_match",
           "normalise_text"]


@dataclass(frozen=True)
class BLEUParams:
    """The parameters of sentence BLEU."""

    lowercase: bool = field(default=False, metadata={"help": "compare lowercased text"})
    tokenize: Literal["13a", "intl", "char", "zh", "none"] = field(
        default="13a", metadata={"help": "sacrebleu's tokenizer (13a: its default; char, zh: for Chinese)"})


@dataclass(frozen=True)
class LowercaseBLEUParams(BLEUParams):
    """The parameters of ``sentence_bleu_lowercase``: lowercased by default."""

    lowercase: bool = field(default=True, metadata={"help": "compare lowercased text"})


@parameterised(BLEUParams)
class SentenceBLEU:
    """Sentence BLEU (sacrebleu, effective order, case-sensitive) / 100, in [0, 1]."""

    def __init__(self, params: BLEUParams | None = None) -> None:
        self.params = params or self.parameters()
        self._metric = BLEU(lowercase=self.params.lowercase, tokenize=self.params.tokenize, effective_order=True)

    def __call__(self, predictions: list[str], references: list[str]) -> list[float]:
        _check_lengths(predictions, references)
        return [self._metric.sentence_score(p, [r]).score / 100 for p, r in zip(predictions, references)]


@parameterised(LowercaseBLEUParams)
class LowercaseSentenceBLEU(SentenceBLEU):
    """Sentence BLEU (sacrebleu, effective order, lowercased) / 100, in [0, 1]."""


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
    register("sentence_bleu_lowercase", LowercaseSentenceBLEU())
    register("exact_match", exact_match)
