"""A slow, obvious reference of ``tree_rloo`` and ``tree_otb``, written from
docs/estimators.md alone: plain lists and loops, one response and one token at a time.

Each group is a list of ``Response`` with ``logprobs`` and ``sum_pi_squared`` per token;
nodes come from the LEAF reference (boundaries by surprisal, exact prefix classes).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from reference_estimators import boundary_nodes, leaf_boundaries, mean, sample_std

KAPPA_EDGES = [1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3]


@dataclass
class Response:
    tokens: list[int]
    reward: float
    surprisal: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sum_pi_squared: list[float] = field(default_factory=list)


def node_values(group: list[Response], i: int, nodes, shrink: float) -> list[tuple[int, float]]:
    """``(position, V̂)`` along response ``i``'s path, the root first."""
    others = [r.reward for j, r in enumerate(group) if j != i]
    value = mean(others) if others else group[i].reward
    chain = [(0, value)]
    for position, members, _ in sorted((n for n in nodes if i in n[1]), key=lambda n: n[0]):
        rest = [group[k].reward for k in members if k != i]
        value = (sum(rest) + shrink * value) / (len(rest) + shrink)
        chain.append((position, value))
    return chain


def token_values(group: list[Response], i: int, nodes, shrink: float) -> list[float]:
    """``V̂`` of each token: the deepest path node at or before it."""
    chain = node_values(group, i, nodes, shrink)
    return [[v for p, v in chain if p <= t][-1] for t in range(len(group[i].tokens))]


def group_scale(group: list[Response], scale: str, std_floor: float, eps: float) -> float:
    if scale == "none":
        return 1.0
    spread = max(sample_std([r.reward for r in group]), std_floor)
    return spread + eps if spread > 0 else math.inf  # an all-equal group: advantages 0


def batch_scale(groups: list[list[Response]], std_floor: float, eps: float) -> float:
    """``scale: batch_std``: the within-group std pooled over the batch's groups."""
    squares = freedom = 0.0
    for group in groups:
        mean = sum(r.reward for r in group) / len(group)
        squares += sum((r.reward - mean) ** 2 for r in group)
        freedom += len(group) - 1
    spread = max(math.sqrt(squares / max(freedom, 1.0)), std_floor)
    return spread + eps if spread > 0 else math.inf  # no spread in the whole batch: advantages 0


def auto_shrinks(groups: list[list[Response]], nodes_per_group, fallback: float = 4.0) -> list[float]:
    """``shrink: auto``: each group's prior weight ``σ² / τ²`` from the other groups' nodes
    (docs/estimators.md), one node at a time."""
    stats = []
    for group, nodes in zip(groups, nodes_per_group):
        within = dof = squares = noise = count = 0.0
        for position, members, _ in nodes:
            rewards = [group[k].reward for k in members]
            earlier = [n for n in nodes if n[0] < position and members[0] in n[1]]
            parent = [group[k].reward for k in max(earlier, key=lambda n: n[0])[1]] if earlier \
                else [r.reward for r in group]
            within += sum((r - mean(rewards)) ** 2 for r in rewards)
            dof += len(rewards) - 1
            squares += (mean(rewards) - mean(parent)) ** 2
            noise += 1 / len(rewards) - 1 / len(parent)
            count += 1
        stats.append((within, dof, squares, noise, count))
    out = []
    for g in range(len(groups)):
        within, dof, squares, noise, count = [sum(s[k] for h, s in enumerate(stats) if h != g) for k in range(5)]
        sigma2 = within / dof if dof > 0 else 0.0
        if len(groups) < 2 or count == 0 or sigma2 <= 0:
            out.append(fallback)
            continue
        tau2 = max(0.0, (squares - sigma2 * noise) / count)
        out.append(min(sigma2 / tau2, 1e6) if tau2 > 0 else 1e6)
    return out


def tree_nodes(group, fork_budget, min_group, horizon):
    return boundary_nodes(group, leaf_boundaries(group, fork_budget, horizon), min_group)


def tree_rloo(group, fork_budget=2, min_group=2, horizon="shortest", shrink=4.0, scale="group_std",
              std_floor=0.0, eps=1e-6) -> list[list[float]]:
    nodes = tree_nodes(group, fork_budget, min_group, horizon)
    c = group_scale(group, scale, std_floor, eps)
    return [[(r.reward - v) / c for v in token_values(group, i, nodes, shrink)] for i, r in enumerate(group)]


def weight(r: Response, t: int) -> float:
    return max(0.0, 1 - 2 * math.exp(r.logprobs[t]) + r.sum_pi_squared[t])


def kappas(groups: list[list[Response]], g: int, ridge: float = 0.0) -> tuple[float, list[float]]:
    """The floor ``f_g`` and ``κ_{g,k}`` per bin, from every other group (each token's
    weight ``w + ridge``)."""
    others = [h for h in range(len(groups)) if h != g]
    if not others:
        return 0.0, [1.0] * (len(KAPPA_EDGES) + 1)
    floor = min(r.reward for h in others for r in groups[h])
    above = [0.0] * (len(KAPPA_EDGES) + 1)
    below = [0.0] * (len(KAPPA_EDGES) + 1)
    total = [0.0] * (len(KAPPA_EDGES) + 1)
    for h in others:
        group_mean = mean([r.reward for r in groups[h]])
        for r in groups[h]:
            for t in range(len(r.tokens)):
                k = bisect.bisect_left(KAPPA_EDGES, 1 - r.sum_pi_squared[t])
                w = weight(r, t) + ridge
                above[k] += w * (r.reward - floor)
                below[k] += w * (group_mean - floor)
                total[k] += w
    return floor, [a / b if b > 1e-12 * max(t, 1e-300) else 1.0 for a, b, t in zip(above, below, total)]


def tree_otb(groups: list[list[Response]], fork_budget=2, min_group=2, horizon="shortest", shrink=4.0,
             scale="batch_std", std_floor=0.0, eps=1e-6, own_share=True, prefix_mean=True,
             ridge=0.025) -> list[list[list[float]]]:
    """Advantages of every group of one batch (κ reads the other groups)."""
    out = []
    every_nodes = [tree_nodes(group, fork_budget, min_group, horizon) for group in groups]
    shrinks = auto_shrinks(groups, every_nodes) if shrink == "auto" else [shrink] * len(groups)
    for g, group in enumerate(groups):
        nodes, shrink = every_nodes[g], shrinks[g]
        floor, kappa = kappas(groups, g, ridge)
        c = batch_scale(groups, std_floor, eps) if scale == "batch_std" else group_scale(group, scale, std_floor, eps)
        cumulative = [[sum(weight(r, u) for u in range(t + 1)) for t in range(len(r.tokens))] for r in group]
        values = [token_values(group, i, nodes, shrink) for i in range(len(group))]
        rows = []
        for i, r in enumerate(group):
            row = []
            for t in range(len(r.tokens)):
                # with prefix_mean: the others whose tokens 0 … t are i's, i included
                sharing = [j for j, other in enumerate(group) if other.tokens[: t + 1] == r.tokens[: t + 1]] \
                    if prefix_mean else [i]
                reward = mean([group[j].reward for j in sharing])
                value = mean([values[j][t] for j in sharing])
                k = bisect.bisect_left(KAPPA_EDGES, 1 - r.sum_pi_squared[t])
                advantage = reward - (floor + kappa[k] * (value - floor))
                if own_share:
                    running = sum(cumulative[j][t] for j in range(len(group)) if t < len(group[j].tokens))
                    advantage *= 1 - (cumulative[i][t] / running if running > 0 else 0.0)
                elif len(group) == 1:
                    advantage = 0.0
                row.append(advantage / c)
            rows.append(row)
        out.append(rows)
    return out
