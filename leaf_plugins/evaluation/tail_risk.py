"""Tail risk of per-item scores: CVaR@alpha, fraction below a threshold, bootstrap CIs.

Every statistic here is written for a ``[R, n]`` tensor (one row per resample), so the
non-parametric bootstrap evaluates all resamples in one tensor operation (resamples are
processed in chunks only to bound memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = [
    "Estimate",
    "cvar",
    "fraction_below",
    "mean",
    "bootstrap",
    "tail_risk_report",
    "BOOTSTRAP_RESAMPLES",
    "CHUNK_ELEMENTS",
]

BOOTSTRAP_RESAMPLES = 1000
"""Resamples of the paper's bootstrap CIs (Section 4, "Statistical analysis")."""

CHUNK_ELEMENTS = 1 << 22
"""Resampled values held in memory at once by the bootstrap (4M values, 32 MB as float64)."""

Statistic = Callable[[torch.Tensor], torch.Tensor]  # [R, n] -> [R]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval."""

    value: float
    low: float
    high: float
    level: float = 0.95

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"

    def scaled(self, factor: float) -> "Estimate":
        """The same estimate with value and bounds multiplied by ``factor``."""
        return Estimate(self.value * factor, self.low * factor, self.high * factor, self.level)


def _as_rows(scores: torch.Tensor | Sequence[float]) -> torch.Tensor:
    values = torch.as_tensor(scores, dtype=torch.float64)
    if values.dim() == 1:
        values = values.unsqueeze(0)
    if values.dim() != 2 or values.shape[1] == 0:
        raise ValueError(f"scores must be a non-empty [n] or [R, n] array, got shape {tuple(values.shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("scores hold NaN or infinite values; drop or fix those items first")
    return values


def mean(scores: torch.Tensor) -> torch.Tensor:
    """Row means of ``[R, n]`` scores → ``[R]``."""
    return _as_rows(scores).mean(dim=1)


def cvar(scores: torch.Tensor | Sequence[float], alpha: float) -> torch.Tensor:
    """CVaR@alpha of each row of ``[R, n]`` (or one ``[n]``) scores → ``[R]``: the mean
    of the worst (lowest) ``alpha`` fraction of the items.

    When ``alpha * n`` is not an integer the item at the boundary counts with the
    fractional weight ``alpha * n - floor(alpha * n)`` (the exact lower-tail CVaR of the
    empirical distribution, Rockafellar & Uryasev 2000); when it is an integer k this is
    the plain mean of the k lowest scores.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
    values = _as_rows(scores)
    n = values.shape[1]
    mass = alpha * n
    ranks = torch.arange(n, dtype=torch.float64)
    weights = (mass - ranks).clamp(0.0, 1.0)  # [n]: 1 for the floor(mass) lowest, the rest fractional
    lowest = torch.sort(values, dim=1).values  # [R, n]
    return (lowest * weights).sum(dim=1) / mass


def fraction_below(scores: torch.Tensor | Sequence[float], threshold: float) -> torch.Tensor:
    """Fraction of the items of each row scoring strictly below ``threshold`` → ``[R]``."""
    return (_as_rows(scores) < threshold).to(torch.float64).mean(dim=1)


def bootstrap(
    scores: torch.Tensor | Sequence[float],
    statistic: Statistic,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Non-parametric percentile bootstrap CI of ``statistic`` on the items ``[n]``.

    Draws ``resamples`` resamples of n items with replacement (seeded: the same call
    gives the same interval), evaluates ``statistic`` on all of them at once and returns
    the statistic of the full sample with the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the resampled statistics.
    """
    values = _as_rows(scores)
    if values.shape[0] != 1:
        raise ValueError(f"bootstrap takes one sample [n], got {values.shape[0]} rows")
    items = values[0]  # [n]
    n = items.numel()
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, CHUNK_ELEMENTS // n)
    replicates = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        index = torch.randint(n, (rows, n), generator=generator)  # [rows, n]
        replicates.append(statistic(items[index]))  # [rows]
    stats = torch.cat(replicates)  # [R]
    tail = (1.0 - level) / 2
    low, high = torch.quantile(stats, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return Estimate(float(statistic(items.unsqueeze(0))[0]), low, high, level)


def tail_risk_report(
    scores: torch.Tensor | Sequence[float],
    alphas: Sequence[float] = (0.10, 0.25),
    threshold: float = 50.0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict[str, Estimate]:
    """The paper's tail-risk row (Table ``tab:cvar``) with bootstrap 95% CIs.

    :return: ``{"mean": …, "cvar@10": …, "cvar@25": …, "frac<50": …}`` (keys follow
        ``alphas`` in percent and ``threshold``); fractions are in [0, 1].
    """
    report = {"mean": bootstrap(scores, mean, resamples, seed=seed)}
    for alpha in alphas:
        key = f"cvar@{alpha * 100:g}"
        report[key] = bootstrap(scores, lambda rows, a=alpha: cvar(rows, a), resamples, seed=seed)
    report[f"frac<{threshold:g}"] = bootstrap(
        scores, lambda rows: fraction_below(rows, threshold), resamples, seed=seed
    )
    return report

