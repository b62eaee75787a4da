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
    """``[G, P]``: per group, (1/K) Σ_i Σ_t A_{i,t} ∇ log π(a_{i,t} | s_{i,t}) with respect
    to the learnable parameters (``P`` of them), over real tokens.

    For a softmax, ∇ log π(a | s) with respect to the logits of state ``s`` is
    ``onehot(a) - π(· | s)``: the table's gradient lives in row ``s``; with shared
    features it is ``φ(s) ⊗ (onehot(a) - π(· | s))``.
    """
    regime = env.regime
    h, states, actions = regime.horizon, regime.vocab + 1, regime.actions
    policy = env.policy().detach()  # [H, V+1, A]
    real = groups.mask  # [N, H]
    positions = torch.arange(h).expand_as(groups.tokens)  # [N, H]
    taken = groups.tokens.clamp(min=0)
    score = torch.nn.functional.one_hot(taken, actions).double() - policy[positions, groups.previous]  # [N, H, A]
    weight = torch.where(real, advantages.double(), 0.0)
    contribution = weight.unsqueeze(2) * score  # [N, H, A]
    group = groups.batch.groups.index.unsqueeze(1).expand_as(groups.tokens)  # [N, H]
    row = (group * h + positions) * states + groups.previous  # [N, H] flat (group, t, prev)
    table = torch.zeros(groups.count * h * states, actions, dtype=torch.float64)
    table.index_add_(0, row.reshape(-1), contribution.reshape(-1, actions))
    table = table.view(groups.count, h * states, actions) / regime.group_size  # [G, S, A]
    if env.features is None:
        return table.reshape(groups.count, -1)
    features = env.features.reshape(h * states, -1)  # [S, F]
    return torch.einsum("gsa,sf->gfa", table, features).reshape(groups.count, -1)


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
    truth_credit = true_advantages(env, groups.tokens, groups.lengths)
    correlation = _group_correlations(advantages.double(), truth_credit, groups)
    return CreditMeasures(interval(cosine), cosine, nmse, mean_cosine, interval(correlation))


def _group_correlations(estimated: torch.Tensor, truth: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``[G]`` Pearson correlation over each group's real tokens (NaN where either is
    constant)."""
    real = groups.mask.reshape(groups.count, -1).double()  # groups are contiguous and of equal size K
    count = real.sum(dim=1, keepdim=True)
    a = estimated.reshape(groups.count, -1)
    b = truth.reshape(groups.count, -1)
    a = (a - (a * real).sum(dim=1, keepdim=True) / count) * real
    b = (b - (b * real).sum(dim=1, keepdim=True) / count) * real
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
