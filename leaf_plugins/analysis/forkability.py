"""Forkability (paper Section 5 and Appendix "Forkability: per-cell measurements").

A *boundary attempt* is one LEAF-selected boundary ``p`` of one rollout group. At ``p``
the group's responses are split by exact equality of their first ``p`` tokens (a
response shorter than ``p`` is keyed by its whole sequence). The attempt *fires* if some
prefix group has at least 2 members, and is *usable* if some such group's rewards spread
by more than ``tau`` (``max - min > tau``). The usable fork-fire rate ``r_f`` is
usable attempts / attempts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import torch
from tqdm.auto import tqdm

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.interrupts import interrupt_point
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

__all__ = [
    "ForkEvents",
    "ForkabilityReport",
    "fork_events",
    "forkability_from_batches",
    "wilson_interval",
    "depth_quantile",
    "SUMMARY_COLUMNS",
    "POSITION_COLUMNS",
]

Z95 = 1.959963984540054


@dataclass(frozen=True)
class ForkEvents:
    """Boundary attempts of a batch and the fired prefix groups at them."""

    position: torch.Tensor  # [A] int64: boundary position of each attempt
    fired: torch.Tensor  # [A] bool
    usable: torch.Tensor  # [A] bool
    group_size: torch.Tensor  # [F] int64: members of each fired prefix group (>= 2)
    group_spread: torch.Tensor  # [F] float64: max - min reward within each fired prefix group
    group_position: torch.Tensor  # [F] int64: the boundary it fired at


@torch.inference_mode()
def fork_events(batch: RolloutBatch, positions: torch.Tensor, tau: float = 0.0) -> ForkEvents:
    """Fire/usable outcome of every boundary attempt, computed from the batch tokens.

    :param batch: the rollout groups (tokens and rewards are read).
    :param positions: ``[G, B]`` boundaries per group (``-1`` = no boundary), e.g. the
        ``boundary_table.positions`` of a LEAF estimate.
    :param tau: reward-spread tolerance of a usable fire.
    """
    n, slots = batch.size, positions.shape[1]
    prefixes = SortedPrefixes.lexicographic_exact(batch)  # group-major, lexicographic within a group
    order, group = prefixes.order, prefixes.group  # [N] each
    flat = prefixes.classes_at(positions).reshape(-1)  # [N*B] prefix class per sorted response and boundary
    count = n * slots
    size = torch.bincount(flat, minlength=count)  # [C]
    rewards = batch.rewards.to(torch.float64)[order].unsqueeze(1).expand(n, slots).reshape(-1)  # [N*B]
    high = torch.full((count,), -math.inf, dtype=torch.float64).scatter_reduce(0, flat, rewards, "amax")
    low = torch.full((count,), math.inf, dtype=torch.float64).scatter_reduce(0, flat, rewards, "amin")
    attempt = (group.unsqueeze(1) * slots + torch.arange(slots, device=batch.device)).reshape(-1)  # [N*B]
    class_attempt = torch.zeros(count, dtype=torch.int64).scatter(0, flat, attempt)  # [C]
    valid = (positions >= 0).reshape(-1)  # [G*B]
    fired_class = (size >= 2) & valid[class_attempt]  # [C]
    usable_class = fired_class & (high - low > tau)
    attempts = positions.numel()
    fired = torch.zeros(attempts, dtype=torch.int64).index_add_(0, class_attempt, fired_class.to(torch.int64)) > 0
    usable = torch.zeros(attempts, dtype=torch.int64).index_add_(0, class_attempt, usable_class.to(torch.int64)) > 0
    spots = positions.reshape(-1)  # [G*B]
    return ForkEvents(
        position=spots[valid],
        fired=fired[valid],
        usable=usable[valid],
        group_size=size[fired_class],
        group_spread=(high - low)[fired_class],
        group_position=spots[class_attempt[fired_class]],
    )


def wilson_interval(successes: torch.Tensor, trials: torch.Tensor, z: float = Z95) -> tuple[torch.Tensor, torch.Tensor]:
    """Wilson score interval of binomial proportions (elementwise; NaN where trials = 0)."""
    k, n = successes.to(torch.float64), trials.to(torch.float64)
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * torch.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half).clamp(0.0, 1.0), (centre + half).clamp(0.0, 1.0)


def depth_quantile(positions: torch.Tensor, q: float) -> int | None:
    """The smallest position by which a fraction ``q`` of the given fire positions has
    occurred (inverse empirical CDF: the ``ceil(q * n)``-th smallest); None when empty."""
    if positions.numel() == 0:
        return None
    ordered = torch.sort(positions).values
    return int(ordered[max(math.ceil(q * positions.numel()) - 1, 0)])


SUMMARY_COLUMNS = (
    "label", "tau", "groups", "attempts", "fired", "usable", "fire_rate", "r_f", "r_f_wilson_low", "r_f_wilson_high",
    "r_f_boot_low", "r_f_boot_high", "group_size", "reward_spread", "mu_pos", "p50", "p90", "p99", "last",
    "n_pos",
)
POSITION_COLUMNS = ("label", "position", "attempts", "fired", "usable", "rate", "wilson_low", "wilson_high")


@dataclass
class ForkabilityReport:
    """Accumulated fork events of one cell (one log or one sampling pass)."""

    label: str
    tau: float
    groups: int = 0
    _events: list[ForkEvents] = field(default_factory=list, repr=False)

    def add(self, events: ForkEvents, groups: int) -> None:
        self._events.append(events)
        self.groups += groups

    def _cat(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        parts = [getattr(events, name) for events in self._events]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

    @property
    def events(self) -> ForkEvents:
        """All attempts and fired groups so far, concatenated."""
        return ForkEvents(
            self._cat("position", torch.int64), self._cat("fired", torch.bool), self._cat("usable", torch.bool),
            self._cat("group_size", torch.int64), self._cat("group_spread", torch.float64),
            self._cat("group_position", torch.int64),
        )

    def per_position(self) -> list[dict]:
        """One row per boundary position with attempts: counts, usable rate, Wilson 95% CI."""
        events = self.events
        if events.position.numel() == 0:
            return []
        width = int(events.position.max()) + 1
        attempts = torch.bincount(events.position, minlength=width)
        fired = torch.bincount(events.position, weights=events.fired.to(torch.float64), minlength=width)
        usable = torch.bincount(events.position, weights=events.usable.to(torch.float64), minlength=width)
        low, high = wilson_interval(usable, attempts)
        rows = []
        for p in torch.nonzero(attempts).squeeze(1).tolist():
            rows.append({"label": self.label, "position": p, "attempts": int(attempts[p]), "fired": int(fired[p]),
                         "usable": int(usable[p]), "rate": float(usable[p] / attempts[p]),
                         "wilson_low": float(low[p]), "wilson_high": float(high[p])})
        return rows

    def summary(self, resamples: int = 5000, seed: int = 0) -> dict:
        """The paper's per-cell row: rates (fractions), Wilson CI of r_f over attempts,
        per-position bootstrap CI of the pooled r_f (positions resampled with replacement,
        ``resamples`` times, pooled rate = resampled usable / resampled attempts), mean fired
        group size, mean within-group reward spread (max - min), usable-weighted mean
        position, depth quantiles and number of positions of usable fires."""
        events = self.events
        attempts, fired, usable = events.position.numel(), int(events.fired.sum()), int(events.usable.sum())
        nan = float("nan")
        row = {"label": self.label, "tau": self.tau, "groups": self.groups, "attempts": attempts, "fired": fired,
               "usable": usable}
        if attempts == 0:
            return {**row, **{key: nan for key in SUMMARY_COLUMNS if key not in row}}
        low, high = wilson_interval(torch.tensor(usable), torch.tensor(attempts))
        boot_low, boot_high = _position_bootstrap(self.per_position(), resamples, seed)
        deep = events.position[events.usable]  # [U] positions of usable fires
        row.update({
            "fire_rate": fired / attempts, "r_f": usable / attempts,
            "r_f_wilson_low": float(low), "r_f_wilson_high": float(high),
            "r_f_boot_low": boot_low, "r_f_boot_high": boot_high,
            "group_size": float(events.group_size.to(torch.float64).mean()) if fired else nan,
            "reward_spread": float(events.group_spread.mean()) if fired else nan,
            "mu_pos": float(deep.to(torch.float64).mean()) if usable else nan,
            "p50": depth_quantile(deep, 0.50), "p90": depth_quantile(deep, 0.90), "p99": depth_quantile(deep, 0.99),
            "last": int(deep.max()) if usable else None, "n_pos": int(torch.unique(deep).numel()),
        })
        return row


def _position_bootstrap(rows: list[dict], resamples: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of the pooled rate with positions as the resampling unit."""
    attempts = torch.tensor([row["attempts"] for row in rows], dtype=torch.float64)  # [P]
    usable = torch.tensor([row["usable"] for row in rows], dtype=torch.float64)  # [P]
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(attempts.numel(), (resamples, attempts.numel()), generator=generator)  # [R, P]
    pooled = usable[index].sum(dim=1) / attempts[index].sum(dim=1)  # [R]
    tail = (1 - level) / 2
    low, high = torch.quantile(pooled, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return low, high


def forkability_from_batches(
    batches: Iterable[RolloutBatch],
    fork_budget: int = 2,
    tau: float = 0.0,
    label: str = "rollouts",
    estimator: str = "leaf",
    total: int | None = None,
    **params: object,
) -> ForkabilityReport:
    """Forkability of rollout groups: LEAF selects the boundaries of every group
    (``leaf_plugins.estimate(batch, estimator, fork_budget=…, **params)``), then every
    boundary attempt is classified by ``fork_events``.

    :param batches: rollout batches with surprisal and rewards (from a rollout log or a
        fresh sampling pass).
    :param total: number of batches, for the progress bar's ETA (optional).
    """
    from leaf_plugins.core.engine import Engine

    engine = Engine(estimator, {"fork_budget": fork_budget, **params})
    report = ForkabilityReport(label=label, tau=tau)
    for batch in tqdm(batches, desc=f"forkability {label}", unit="batch", total=total):
        interrupt_point()  # Ctrl-C stops between batches
        result = engine.estimate(batch)
        report.add(fork_events(batch, result.boundary_table.positions, tau), batch.groups.count)
    return report
