"""Statistics over seeds and items for studies: the hierarchical bootstrap of a paired
difference, and the interquartile mean.

A study asks "does variation X beat the baseline variation?". Its runs are paired: the
same seeds, evaluated on the same held-out items. The uncertainty has two levels — which
seeds were drawn and which items — so the bootstrap resamples both: seeds with
replacement, then, for every drawn seed, its items with replacement (the same items for X
and the baseline, which keeps the pairing). With few seeds the seed level cannot be
resampled meaningfully (two seeds give at most three distinct resamples); then only the
items are resampled within the fixed seeds, and the table says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from leaf_plugins.evaluation.bleu_interval import resample_weights

__all__ = ["MIN_SEEDS_FOR_INTERVAL", "MIN_SEEDS_FOR_IQM", "SeedStatistic", "Interval", "hierarchical_bootstrap",
           "interquartile_mean", "mean_statistic"]

MIN_SEEDS_FOR_INTERVAL = 5
"""Fewest seeds for a seed-level interval: with S seeds there are C(2S-1, S) distinct
resamples of seeds (3 for S = 2, 10 for S = 3, 35 for S = 4, 126 for S = 5), too few below
five for a percentile interval to mean more than the range of the seeds."""

MIN_SEEDS_FOR_IQM = 4
"""Fewest seeds for an interquartile mean (it trims floor(S/4) seeds at each end: none below four)."""

SeedStatistic = Callable[[torch.Tensor], torch.Tensor]
"""Item weights ``[m, n]`` (how often each of a seed's n items is drawn, per resample) →
the statistic of each resample ``[m]``; all ones gives the full-sample value."""


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; ``seed_level`` says whether seeds
    were resampled (else only items within the fixed seeds)."""

    value: float
    low: float
    high: float
    seeds: int
    seed_level: bool

    def __str__(self) -> str:
        return f"{self.value:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def mean_statistic(values: torch.Tensor) -> SeedStatistic:
    """The weighted mean of per-item ``values [n]`` (e.g. paired differences)."""
    values = values.to(torch.float64)
    return lambda weights: (weights @ values) / weights.sum(dim=1)  # [m]


def hierarchical_bootstrap(
    statistics: Sequence[SeedStatistic], items: Sequence[int], resamples: int = 1000, level: float = 0.95,
    seed: int = 0, min_seeds: int = MIN_SEEDS_FOR_INTERVAL,
) -> Interval:
    """Percentile bootstrap interval of the mean over seeds of a per-seed statistic.

    :param statistics: one ``SeedStatistic`` per seed (e.g. the paired difference of a
        variation and the baseline on that seed's items).
    :param items: the number of items of each seed.
    :return: the mean over seeds of the full-sample statistics and the interval. With at
        least ``min_seeds`` seeds each resample draws S seeds with replacement and then,
        for every drawn seed, its items with replacement; with fewer seeds the seeds stay
        fixed and only their items are resampled (``seed_level`` False).
    """
    count = len(statistics)
    if count == 0 or len(items) != count:
        raise ValueError(f"need one item count per seed statistic, got {len(items)} for {count}")
    point = sum(float(statistic(torch.ones(1, n, dtype=torch.float64))[0]) for statistic, n in zip(statistics, items))
    point /= count
    generator = torch.Generator().manual_seed(seed)
    seed_level = count >= min_seeds
    if seed_level:
        chosen = torch.randint(count, (resamples, count), generator=generator)  # [R, S] drawn seeds
    else:
        chosen = torch.arange(count).expand(resamples, count)  # [R, S] every seed, once
    values = torch.empty(resamples, count, dtype=torch.float64)  # [R, S]
    for index, (statistic, n) in enumerate(zip(statistics, items)):
        slots = chosen == index  # [R, S]
        drawn = int(slots.sum())
        if drawn:
            weights = resample_weights(n, drawn, int(torch.randint(2**62, (1,), generator=generator)))  # [k, n]
            values[slots] = statistic(weights)
    replicates = values.mean(dim=1)  # [R]
    tail = (1 - level) / 2
    low, high = torch.quantile(replicates, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return Interval(point, low, high, count, seed_level)


def interquartile_mean(values: Sequence[float]) -> float:
    """The interquartile mean (rliable's IQM, ``scipy.stats.trim_mean(values, 0.25)``):
    the mean after dropping floor(n/4) of the smallest and of the largest values; NaN
    for fewer than ``MIN_SEEDS_FOR_IQM`` values."""
    ordered = sorted(values)
    if len(ordered) < MIN_SEEDS_FOR_IQM:
        return math.nan
    cut = len(ordered) // 4
    kept = ordered[cut : len(ordered) - cut]
    return sum(kept) / len(kept)
