"""A tempered baseline as a leaf-plugins estimator with a parameter of its own.

Each response's advantage is its reward minus the *soft maximum* of its group's rewards
at temperature τ, broadcast to every token:

    A_i = r_i - b,    b = τ · log( (1/K) Σ_j exp(r_j / τ) )

As τ grows, b tends to the group's mean (GRPO's baseline without its division by the
std); as τ falls toward 0, b tends to the group's best reward, so that only responses
near the best get a positive advantage (a risk-seeking baseline). b always lies between
the mean and the maximum, so a group of equal rewards gets 0 everywhere.

The estimator declares its parameter as a dataclass (``TemperedParams``): its field's
type hint, default and help are what ``leaf plugins`` lists and what leaf-plugins checks
in ``Engine("tempered", params={...})``, ``estimator.params.temperature`` in a run
config or a study grid; ``__post_init__`` adds the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from leaf_plugins import Boundaries, Nodes, RolloutBatch, hookimpl


@dataclass(frozen=True)
class TemperedParams:
    """The tempered baseline's parameters."""

    temperature: float = field(default=1.0, metadata={
        "help": "tau > 0 of the soft-maximum baseline: large -> the group mean, small -> the group's best reward"})

    def __post_init__(self) -> None:
        if not 0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")


class Tempered:
    """Tempered baseline: r_i minus the soft maximum tau * log mean exp(r / tau) of its group."""

    parameters = TemperedParams

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: TemperedParams) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: TemperedParams) -> Nodes:
        layout = batch.groups
        empty = torch.zeros(0, dtype=torch.int64, device=batch.device)
        return Nodes(
            group=empty,
            position=empty,
            value=torch.zeros(0, device=batch.device),
            size=empty,
            path=torch.full((batch.size, 0), -1, dtype=torch.int64, device=batch.device),
            root_value=tempered_baselines(batch.rewards, layout.index, layout.count, params.temperature).float(),
        )

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: TemperedParams) -> torch.Tensor:
        baseline = nodes.root_value.double()[batch.groups.index]  # [N]
        advantage = (batch.rewards.double() - baseline).float()  # [N]
        return torch.where(batch.mask, advantage.unsqueeze(1), 0.0)  # [N, T]


def tempered_baselines(rewards: torch.Tensor, group: torch.Tensor, groups: int, temperature: float) -> torch.Tensor:
    """``[G]`` float64 soft maxima ``τ log mean_j exp(r_j / τ)`` of each group's rewards.

    :param rewards: ``[N]`` rewards; ``group``: ``[N]`` int64 group of each response.
    Computed from the group's maximum ``m`` as ``m + τ log mean exp((r - m) / τ)``, so
    that no exponential overflows whatever τ and the rewards are.
    """
    rewards = rewards.double()
    top = torch.full((groups,), -math.inf, dtype=torch.float64, device=rewards.device)
    top = top.scatter_reduce(0, group, rewards, reduce="amax")  # [G]
    shifted = torch.exp((rewards - top[group]) / temperature)  # [N] in (0, 1]
    total = torch.zeros(groups, dtype=torch.float64, device=rewards.device).index_add_(0, group, shifted)  # [G]
    count = torch.zeros(groups, dtype=torch.float64, device=rewards.device).index_add_(
        0, group, torch.ones_like(rewards))  # [G]
    return top + temperature * torch.log(total / count)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("tempered", Tempered())
