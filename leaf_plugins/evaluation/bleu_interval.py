"""Corpus BLEU with bootstrap confidence intervals over held-out examples.

Corpus BLEU is not a mean of per-item scores, so the bootstrap resamples items and
recomputes corpus BLEU from the resampled sums of sacrebleu's per-item statistics
(n-gram matches and totals, hypothesis and reference lengths). The paired version
resamples the same items for two systems and gives the interval of their difference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch
from sacrebleu.metrics import BLEU

__all__ = ["BleuInterval", "bleu_statistics", "bleu_from_statistics", "bleu_interval", "paired_bleu_interval",
           "resample_weights"]

ORDER = 4  # n-gram order of BLEU
RESAMPLES = 1000


@dataclass(frozen=True)
class BleuInterval:
    """A corpus BLEU (0–100) with its percentile bootstrap interval."""

    score: float
    low: float
    high: float
    items: int

    def __str__(self) -> str:
        return f"{self.score:.2f} [{self.low:.2f}, {self.high:.2f}]"


def bleu_statistics(predictions: Sequence[str], references: Sequence[str], lowercase: bool = True) -> torch.Tensor:
    """``[N, 2*ORDER+2]`` float64 per-item statistics: matches per order, totals per
    order, hypothesis length, reference length (sacrebleu's 13a tokenisation)."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need as many predictions as references (got {len(predictions)} and {len(references)})")
    metric = BLEU(lowercase=lowercase)
    rows = []
    # sacrebleu logs its advice to use effective order once per item; here only the
    # summed statistics count, so the advice is silenced for the loop
    log = logging.getLogger("sacrebleu")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        for prediction, reference in zip(predictions, references):
            score = metric.sentence_score(prediction, [reference])
            rows.append([*score.counts, *score.totals, score.sys_len, score.ref_len])
    finally:
        log.setLevel(level)
    return torch.tensor(rows, dtype=torch.float64)


def bleu_from_statistics(statistics: torch.Tensor) -> torch.Tensor:
    """Corpus BLEU of each row of summed statistics ``[R, 2*ORDER+2]`` → ``[R]``,
    with sacrebleu's default (``exp``) smoothing."""
    scores = [
        BLEU.compute_bleu(row[:ORDER], row[ORDER : 2 * ORDER], row[2 * ORDER], row[2 * ORDER + 1],
                          smooth_method="exp").score
        for row in statistics.round().long().tolist()
    ]
    return torch.tensor(scores, dtype=torch.float64)


def resample_weights(items: int, resamples: int, seed: int) -> torch.Tensor:
    """``[R, N]`` how often each of N items is drawn in each of R bootstrap resamples
    (N draws with replacement per resample; float64 counts, seeded)."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(items, (resamples, items), generator=generator)  # [R, N]
    ones = torch.ones_like(index, dtype=torch.float64)
    return torch.zeros(resamples, items, dtype=torch.float64).scatter_add_(1, index, ones)


def _percentiles(values: torch.Tensor, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return low, high


def bleu_interval(
    predictions: Sequence[str], references: Sequence[str], resamples: int = RESAMPLES, seed: int = 0,
    level: float = 0.95, lowercase: bool = True,
) -> BleuInterval:
    """Corpus BLEU and its percentile bootstrap interval over items."""
    statistics = bleu_statistics(predictions, references, lowercase)  # [N, S]
    score = float(bleu_from_statistics(statistics.sum(dim=0, keepdim=True))[0])
    weights = resample_weights(len(predictions), resamples, seed)  # [R, N]
    low, high = _percentiles(bleu_from_statistics(weights @ statistics), level)
    return BleuInterval(score, low, high, len(predictions))


def paired_bleu_interval(
    predictions: Sequence[str], baseline: Sequence[str], references: Sequence[str], resamples: int = RESAMPLES,
    seed: int = 0, level: float = 0.95, lowercase: bool = True,
) -> BleuInterval:
    """BLEU(predictions) − BLEU(baseline) on the same items, with a paired bootstrap
    interval (both systems scored on every resample of items)."""
    ours = bleu_statistics(predictions, references, lowercase)  # [N, S]
    theirs = bleu_statistics(baseline, references, lowercase)  # [N, S]
    score = float(bleu_from_statistics(ours.sum(0, keepdim=True))[0] - bleu_from_statistics(theirs.sum(0, keepdim=True))[0])
    weights = resample_weights(len(predictions), resamples, seed)  # [R, N]
    differences = bleu_from_statistics(weights @ ours) - bleu_from_statistics(weights @ theirs)  # [R]
    low, high = _percentiles(differences, level)
    return BleuInterval(score, low, high, len(predictions))
