"""A slow, obvious reference of ``otb`` (verl's optimal token baseline), written from
docs/estimators.md alone.

Plain lists and loops, one group at a time, following verl's procedure step by step: a
group of one gets no baseline; otherwise every position's baseline is the W-weighted
mean reward over the responses still running there; then the tail of a unique longest
response beyond the second-longest length gets baseline 0 (``handle_zero_tail``).
Nothing here is shared with the package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EPSILON = 1e-8


@dataclass
class PolicyResponse:
    tokens: list[int]
    reward: float
    logprobs: list[float]  # log π(a_t), one per token
    sum_pi_squared: list[float]  # Σ_v π(v)², one per token


def path_weights(response: PolicyResponse) -> list[float]:
    """W_t = Σ_{u<=t} max(0, 1 - 2π_u + Σπ²_u)."""
    total, out = 0.0, []
    for logprob, square_sum in zip(response.logprobs, response.sum_pi_squared):
        total += max(0.0, 1.0 - 2.0 * math.exp(logprob) + square_sum)
        out.append(total)
    return out


def otb(group: list[PolicyResponse]) -> list[list[float]]:
    """Per response, the advantage of every token."""
    lengths = [len(r.tokens) for r in group]
    baselines = [[0.0] * length for length in lengths]
    if len(group) > 1:
        weights = [path_weights(r) for r in group]
        for t in range(max(lengths, default=0)):
            running = [j for j in range(len(group)) if t < lengths[j]]
            numerator = sum(weights[j][t] * group[j].reward for j in running)
            denominator = sum(weights[j][t] for j in running) + EPSILON
            for j in running:
                baselines[j][t] = numerator / denominator
        ordered = sorted(lengths)
        longest = [j for j in range(len(group)) if lengths[j] == ordered[-1]]
        if len(longest) == 1 and ordered[-1] > ordered[-2]:
            row = baselines[longest[0]]
            for t in range(ordered[-2], len(row)):
                row[t] = 0.0
    return [[r.reward - b for b in row] for r, row in zip(group, baselines)]


def otb_groups(groups: list[list[PolicyResponse]]) -> list[list[list[float]]]:
    """Every group on its own."""
    return [otb(group) for group in groups]
