"""What the benchmark measures on one set of sampled groups."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.bench.credit.exact import exact_gradient, true_advantages
from leaf_plugins.bench.credit.sampling import Groups

__all__ = ["Interval", "CreditMeasures", "Bias", "group_gradients", "gradient_bias", "measure_credit", "forkability",
           "interval", "student_interval", "student_quantile"]

_STUDENT_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
                2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
                2.045, 2.042)
"""The 97.5% quantile of Student's t with 1 … 30 degrees of freedom (standard tables)."""


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% confidence interval (normal approximation from ``interval``,
    Student's t from ``student_interval``)."""

    mean: float
    half_width: float
    count: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.half_width:.3f}"

    def __format__(self, spec: str) -> str:
        return f"{self.mean:{spec}} ± {self.half_width:{spec}}" if spec else str(self)


def interval(values: torch.Tensor) -> Interval:
    """Mean ± 1.96 standard errors of the finite entries of ``values``."""
    finite = values[torch.isfinite(values)].double()
    count = int(finite.numel())
    if count == 0:
        return Interval(float("nan"), float("nan"), 0)
    spread = float(finite.std()) if count > 1 else 0.0
    return Interval(float(finite.mean()), 1.96 * spread / math.sqrt(count), count)


def student_interval(values: torch.Tensor) -> Interval:
    """Mean ± ``t_{0.975, n−1}`` standard errors of the finite entries of ``values``: the
    95% interval for few samples (seeds), where 1.96 would be too narrow (a half-width
    of 0 for a single sample, which gives no interval)."""
    finite = values[torch.isfinite(values)].double()
    count = int(finite.numel())
    if count == 0:
        return Interval(float("nan"), float("nan"), 0)
    if count == 1:
        return Interval(float(finite[0]), float("inf"), 1)
    return Interval(float(finite.mean()), student_quantile(count - 1) * float(finite.std()) / math.sqrt(count), count)


def student_quantile(freedom: int) -> float:
    """The 97.5% quantile of Student's t with ``freedom >= 1`` degrees of freedom: the
    table up to 30, then the Cornish–Fisher expansion around the normal 1.96 (within
    0.001 of the exact value there)."""
    if freedom < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {freedom}")
    if freedom <= len(_STUDENT_975):
        return _STUDENT_975[freedom - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * freedom) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * freedom**2)


@dataclass(frozen=True)
class CreditMeasures:
    """Gradient and token-credit quality of one estimator on one set of groups."""

    cosine: Interval  # per-group cosine(ĝ, ∇J)
    group_cosines: torch.Tensor  # [G] the per-group cosines themselves (for paired comparisons)
    nmse: float  # mean ||c ĝ - ∇J||² / ||∇J||² with the best single scale c
    mean_gradient_cosine: float  # cosine(mean of ĝ over groups, ∇J): the bias of the direction
    token_correlation: Interval  # per-group Pearson correlation of A and Q - V


def group_gradients(
    env: Environment, groups: Groups, advantages: torch.Tensor, buckets: int | None = None
) -> torch.Tensor:
    """``[G, P]``: per group, (1/K) Σ_i Σ_t A_{i,t} ∇ log π(a_{i,t} | s_{i,t}) with respect
    to the learnable parameters (``P`` of them), over real tokens. With ``buckets`` ``C``,
    the mean of these over ``C`` consecutive blocks of groups instead: ``[C, P]``.

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
    count = buckets or groups.count
    group = groups.batch.groups.index.unsqueeze(1).expand_as(groups.tokens)  # [N, H]
    if buckets:
        group = group * buckets // groups.count
    row = (group * h + positions) * states + groups.previous  # [N, H] flat (group or bucket, t, prev)
    table = torch.zeros(count * h * states, actions, dtype=torch.float64)
    table.index_add_(0, row.reshape(-1), contribution.reshape(-1, actions))
    per_row = regime.group_size * (groups.count / buckets if buckets else 1)
    table = table.view(count, h * states, actions) / per_row  # [G or C, S, A]
    if env.features is None:
        return table.reshape(count, -1)
    features = env.features.reshape(h * states, -1)  # [S, F]
    return torch.einsum("gsa,sf->gfa", table, features).reshape(count, -1)


@dataclass(frozen=True)
class Bias:
    """Where the mean estimated gradient over many groups points: its cosine with ∇J and
    its projection ``ḡ·∇J / |∇J|²`` (1 for an unbiased estimator of ∇J at raw scale),
    with 95% CIs from blocks of groups (a jackknife for the cosine), and the *excess*:
    the squared norm of ``ḡ``'s part orthogonal to ∇J over what the sampling noise of the
    block means alone would give. An estimator whose expectation is parallel to ∇J
    (unbiased up to scale) has an excess near 1; a direction bias makes it grow with the
    number of groups."""

    cosine: Interval
    projection: Interval
    excess: float


def gradient_bias(env: Environment, groups: Groups, advantages: torch.Tensor, blocks: int = 20) -> Bias:
    """The bias measures of ``advantages`` on many ``groups`` (``blocks`` blocks)."""
    truth = exact_gradient(env).reshape(-1)  # [P]
    block_means = group_gradients(env, groups, advantages, buckets=blocks)  # [C, P]
    projections = block_means @ truth / truth.square().sum()
    total = block_means.sum(dim=0)
    leave_out = (total.unsqueeze(0) - block_means) / (blocks - 1)  # [C, P]
    cosines = leave_out @ truth / (leave_out.norm(dim=1) * truth.norm()).clamp(min=1e-300)
    mean = total / blocks
    full = float(mean @ truth / (mean.norm() * truth.norm()).clamp(min=1e-300))
    spread = float(((blocks - 1) / blocks * (cosines - cosines.mean()).square().sum()) ** 0.5)  # jackknife
    direction = truth / truth.norm()
    orthogonal = block_means - (block_means @ direction).unsqueeze(1) * direction  # [C, P]
    centre = orthogonal.mean(dim=0)
    noise = (orthogonal - centre).square().sum() / (blocks * (blocks - 1))  # E|noise of the mean|²
    excess = float(centre.square().sum() / noise.clamp(min=1e-300))
    return Bias(Interval(full, 1.96 * spread, blocks), interval(projections), excess)


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
