"""What the benchmark measures on one set of sampled groups."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.bench.credit.exact import exact_gradient, true_advantages
from leaf_plugins.bench.credit.sampling import Groups

__all__ = ["Interval", "CreditMeasures", "group_gradients", "measure_credit", "forkability", "interval"]


@dataclass(frozen=True)
class Interval:
    """A mean with its normal-approximation 95% confidence interval."""

    mean: float
    half_width: float
    count: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.half_width:.3f}"


def interval(values: torch.Tensor) -> Interval:
    """Mean ± 1.96 standard errors of the finite entries of ``values``."""
    finite = values[torch.isfinite(values)].double()
    count = int(finite.numel())
    if count == 0:
        return Interval(float("nan"), float("nan"), 0)
    spread = float(finite.std()) if count > 1 else 0.0
    return Interval(float(finite.mean()), 1.96 * spread / math.sqrt(count), count)


@dataclass(frozen=True)
class CreditMeasures:
    """Gradient and token-credit quality of one estimator on one set of groups."""

    cosine: Interval  # per-group cosine(ĝ, ∇J)
    group_cosines: torch.Tensor  # [G] the per-group cosines themselves (for paired comparisons)
    nmse: float  # mean ||c ĝ - ∇J||² / ||∇J||² with the best single scale c
    mean_gradient_cosine: float  # cosine(mean of ĝ over groups, ∇J): the bias of the direction
    token_correlation: Interval  # per-group Pearson correlation of A and Q - V


def group_gradients(env: Environment, groups: Groups, advantages: torch.Tensor) -> torch.Tensor:
    """``[G, H*(V+1)*V]``: per group, (1/K) Σ_i Σ_t A_{i,t} ∇ log π(a_{i,t} | s_{i,t}).

    For a tabular softmax, ∇ log π(a | t, prev) is ``onehot(a) - π(· | t, prev)`` in the
    row ``(t, prev)`` of the logits and 0 elsewhere.
    """
    regime = env.regime
    h, v = regime.horizon, regime.vocab
    policy = env.policy().detach()  # [H, V+1, V]
    positions = torch.arange(h).expand_as(groups.tokens)  # [N, H]
    score = torch.nn.functional.one_hot(groups.tokens, v).double() - policy[positions, groups.previous]  # [N, H, V]
    contribution = advantages.double().unsqueeze(2) * score  # [N, H, V]
    group = groups.batch.groups.index.unsqueeze(1).expand_as(groups.tokens)  # [N, H]
    row = (group * h + positions) * (v + 1) + groups.previous  # [N, H] flat (group, t, prev)
    out = torch.zeros(groups.count * h * (v + 1), v, dtype=torch.float64)
    out.index_add_(0, row.reshape(-1), contribution.reshape(-1, v))
    return out.reshape(groups.count, -1) / regime.group_size


def measure_credit(env: Environment, groups: Groups, advantages: torch.Tensor) -> CreditMeasures:
    """Gradient cosine, best-scale NMSE, direction bias and token-credit correlation."""
    truth = exact_gradient(env).reshape(-1)  # [P]
    estimates = group_gradients(env, groups, advantages)  # [G, P]
    norms = estimates.norm(dim=1)
    cosine = torch.where(norms > 0, estimates @ truth / (norms * truth.norm()).clamp(min=1e-300), float("nan"))
    scale = float((estimates @ truth).sum() / (norms.square().sum()).clamp(min=1e-300))
    nmse = float(((scale * estimates - truth).square().sum(dim=1) / truth.square().sum()).mean())
    mean_estimate = estimates.mean(dim=0)
    mean_cosine = float(mean_estimate @ truth / (mean_estimate.norm() * truth.norm()).clamp(min=1e-300))
    correlation = _group_correlations(advantages.double(), true_advantages(env, groups.tokens), groups)
    return CreditMeasures(interval(cosine), cosine, nmse, mean_cosine, interval(correlation))


def _group_correlations(estimated: torch.Tensor, truth: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``[G]`` Pearson correlation over each group's tokens (NaN where either is constant)."""
    a = estimated.reshape(groups.count, -1)  # groups are contiguous and of equal size K
    b = truth.reshape(groups.count, -1)
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    denominator = a.norm(dim=1) * b.norm(dim=1)
    return torch.where(denominator > 1e-12, (a * b).sum(dim=1) / denominator.clamp(min=1e-300), float("nan"))


def forkability(nodes_per_group: list[list], boundaries: list[list[int]]) -> tuple[float, float]:
    """(fire rate, mean fired group size): the share of selected boundaries at which some
    prefix group has >= 2 members, and the mean size of those groups."""
    attempts = fired = 0
    sizes: list[int] = []
    for nodes, chosen in zip(nodes_per_group, boundaries):
        for position in chosen:
            attempts += 1
            here = [len(node.members) for node in nodes if node.position == position]
            fired += bool(here)
            sizes += here
    return (fired / attempts if attempts else float("nan"), sum(sizes) / len(sizes) if sizes else float("nan"))
