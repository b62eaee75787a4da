"""A slow, obvious reference of ``tree_rloo`` and ``tree_otb``, written from
docs/estimators.md alone: plain lists and loops, one response and one token at a time.

Each group is a list of ``Response`` with ``logprobs`` and ``sum_pi_squared`` per token;
nodes come from the LEAF reference (boundaries by surprisal, exact prefix classes).
"""

from __future__ import annotations

import bisect
import math

import numpy
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


def kappas(groups: list[list[Response]], g: int, i: int, ridge: float = 0.0) -> tuple[float, list[float]]:
    """The floor ``f`` and ``κ_k`` per bin of response ``i`` of group ``g``, from every
    other response of the batch (each token's weight ``w + ridge``; a response's group mean
    without response ``i``)."""
    others = [(h, j) for h in range(len(groups)) for j in range(len(groups[h])) if (h, j) != (g, i)]
    if not others:
        return 0.0, [1.0] * (len(KAPPA_EDGES) + 1)
    floor = min(groups[h][j].reward for h, j in others)
    above = [0.0] * (len(KAPPA_EDGES) + 1)
    below = [0.0] * (len(KAPPA_EDGES) + 1)
    total = [0.0] * (len(KAPPA_EDGES) + 1)
    for h, j in others:
        group_mean = mean([r.reward for k, r in enumerate(groups[h]) if (h, k) != (g, i)])
        r = groups[h][j]
        for t in range(len(r.tokens)):
            k = bisect.bisect_left(KAPPA_EDGES, 1 - r.sum_pi_squared[t])
            w = weight(r, t) + ridge
            above[k] += w * (r.reward - floor)
            below[k] += w * (group_mean - floor)
            total[k] += w
    return floor, [a / b if b > 1e-12 * max(t, 1e-300) else 1.0 for a, b, t in zip(above, below, total)]


def tree_part(groups: list[list[Response]], fork_budget=2, min_group=2, horizon="shortest", shrink=4.0,
              scale="batch_std", std_floor=0.0, eps=1e-6, own_share=True, prefix_mean=True,
              ridge=0.025) -> list[list[list[float]]]:
    """The prefix tree's advantages (``tree_weight: 1``) of every group of one batch (κ
    and f of each response read the batch's other responses)."""
    out = []
    every_nodes = [tree_nodes(group, fork_budget, min_group, horizon) for group in groups]
    shrinks = auto_shrinks(groups, every_nodes) if shrink == "auto" else [shrink] * len(groups)
    for g, group in enumerate(groups):
        nodes, shrink = every_nodes[g], shrinks[g]
        ratios = [kappas(groups, g, i, ridge) for i in range(len(group))]  # (f, κ) of each response
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
                k = bisect.bisect_left(KAPPA_EDGES, 1 - r.sum_pi_squared[t])
                advantage = mean([(group[j].reward - ratios[j][0]) - ratios[j][1][k] * (values[j][t] - ratios[j][0])
                                  for j in sharing])
                if own_share:
                    running = sum(cumulative[j][t] for j in range(len(group)) if t < len(group[j].tokens))
                    advantage *= 1 - (cumulative[i][t] / running if running > 0 else 0.0)
                elif len(group) == 1:
                    advantage = 0.0
                row.append(advantage / c)
            rows.append(row)
        out.append(rows)
    return out


def divisor(groups: list[list[Response]], g: int, scale: str, std_floor: float, eps: float) -> float:
    return batch_scale(groups, std_floor, eps) if scale == "batch_std" else group_scale(groups[g], scale, std_floor, eps)


def sharing(group: list[Response], i: int, t: int) -> list[int]:
    """The responses whose tokens 0 … t are response ``i``'s (itself included)."""
    return [j for j, other in enumerate(group) if other.tokens[: t + 1] == group[i].tokens[: t + 1]]


def stable_weight(r: Response, t: int) -> float:
    """The token weight ``1 − 2π + Σπ²`` as the package computes it for OTB's part of
    ``tree_otb``: ``2(1 − π) − (1 − Σπ²)`` in float32 (``1 − π = −expm1(log π)``), at
    least 0. Exact arithmetic on the float32 inputs differs by up to a few percent on
    near-deterministic tokens (``Σπ²`` near 1 is known to ±2⁻²⁵), and OTB's baseline is a
    ratio of such weights where every other response is near-deterministic."""
    unlikely = numpy.float32(-numpy.expm1(numpy.float32(r.logprobs[t])))
    spread = numpy.float32(1) - numpy.float32(r.sum_pi_squared[t])
    return max(0.0, float(numpy.float32(numpy.float32(2) * unlikely) - spread))


def otb_part(groups: list[list[Response]], scale="batch_std", std_floor=0.0, eps=1e-6, own_share=True,
             prefix_mean=True) -> list[list[list[float]]]:
    """OTB's advantage with each token's reward replaced by its prefix class's mean reward
    (``prefix_mean``), divided by the scale; 0 for a response alone in its group. With
    ``own_share`` verl's baseline (own return included, 0 where fewer than two run; no
    ``ε``);
    without, the W-weighted mean of the others' returns, the replaced reward standing
    for the response's own in the sums (0 where the others running have no weight)."""
    out = []
    for g, group in enumerate(groups):
        c = divisor(groups, g, scale, std_floor, eps)
        cumulative = [[sum(stable_weight(r, u) for u in range(t + 1)) for t in range(len(r.tokens))] for r in group]
        rows = []
        for i, r in enumerate(group):
            row = []
            for t in range(len(r.tokens)):
                reward = mean([group[j].reward for j in (sharing(group, i, t) if prefix_mean else [i])])
                running = [j for j in range(len(group)) if t < len(group[j].tokens)]
                total = sum(cumulative[j][t] for j in running)
                weighted = sum(cumulative[j][t] * group[j].reward for j in running)
                if own_share:
                    baseline = weighted / total if len(running) >= 2 and total > 0 else 0.0
                else:
                    others = total - cumulative[i][t]
                    baseline = (weighted - cumulative[i][t] * reward) / others if others > 0 else 0.0
                row.append(0.0 if len(group) == 1 else (reward - baseline) / c)
            rows.append(row)
        out.append(rows)
    return out


SIZE_FLOOR, BELOW_FLOOR = 1e-4, 1e-4
"""The rule's thresholds (``mixing_weights``): a group's Z against the largest, the
summed D/Z."""


Unit = tuple[float, float, float]


def _kernel_units(group: list[Response], e: list[list[float]], d: list[list[float]]) -> tuple[list[Unit], list[Unit]]:
    """The units of one group's ``(Σ d K e, Σ d K d, Σ e K e)``: per position ``t`` and
    prefix class ``C`` (the running responses that share tokens ``0 … t``),
    ``Σ_{j∈C} w_j · (d_j E_C, d_j D_C, e_j E_C)``; per ordered pair ``(j, l)`` in one state
    at ``t`` (tokens ``0 … t−1`` shared) with different tokens at ``t``,
    ``k_{jl} · (d_j e_l, d_j d_l, e_j e_l)``, ``k_{jl} = Σπ²_j − π_j − π_l`` the scores'
    inner product; and per token, ``w · (d e, d d, e e)`` (the diagonal, which the class
    units include). Returns (class and pair units, diagonal units)."""
    shared_units, diagonal = [], []
    for t in range(max(len(r.tokens) for r in group)):
        running = [j for j, r in enumerate(group) if len(r.tokens) > t]
        classes: dict[tuple[int, ...], list[int]] = {}
        for j in running:
            classes.setdefault(tuple(group[j].tokens[: t + 1]), []).append(j)
            w = stable_weight(group[j], t)
            diagonal.append((w * d[j][t] * e[j][t], w * d[j][t] * d[j][t], w * e[j][t] * e[j][t]))
        for members in classes.values():
            e_sum, d_sum = sum(e[j][t] for j in members), sum(d[j][t] for j in members)
            shared_units.append(tuple(sum(stable_weight(group[j], t) * x[j][t] for j in members) * y
                                      for x, y in ((d, e_sum), (d, d_sum), (e, e_sum))))
        for j in running:
            for l in running:
                r, other = group[j], group[l]
                if other.tokens[:t] == r.tokens[:t] and other.tokens[t] != r.tokens[t]:
                    inner = r.sum_pi_squared[t] - math.exp(r.logprobs[t]) - math.exp(other.logprobs[t])
                    shared_units.append((inner * d[j][t] * e[l][t], inner * d[j][t] * d[l][t],
                                         inner * e[j][t] * e[l][t]))
    return shared_units, diagonal


def _weight_statistics(groups: list[list[Response]], base, move):
    """Per group its units ``(n, d)`` times their coefficients in ``V_g / Z_g`` (a class or
    pair unit ``−1/((K − 1) Z)``, a diagonal one ``K/((K − 1) Z)``; none for an
    uninformative group), the groups' Z, whether each is usable (rewards not all equal)
    and the largest usable Z."""
    units = [_kernel_units(group, base[g], move[g]) for g, group in enumerate(groups)]
    sizes = [sum(unit[2] for unit in shared) for shared, _ in units]
    spread = [max(r.reward for r in group) > min(r.reward for r in group) for group in groups]
    largest = max([z for z, usable in zip(sizes, spread) if usable], default=0.0)
    stats = []
    for g, (shared, diagonal) in enumerate(units):  # a group whose Z is at most SIZE_FLOOR of the largest says nothing
        if not (spread[g] and sizes[g] > SIZE_FLOOR * largest):
            stats.append([])
            continue
        k = len(groups[g])
        together, alone = -1 / ((k - 1) * sizes[g]), k / ((k - 1) * sizes[g])
        stats.append([(n * together, dd * together) for n, dd, _ in shared]
                     + [(n * alone, dd * alone) for n, dd, _ in diagonal])
    return stats, sizes, spread, largest


def weights_near_thresholds(groups: list[list[Response]], factor: float = 10.0) -> bool:
    """Whether one of the rule's threshold decisions is within ``factor`` of its
    threshold for these groups: there float32 and float64 may rightly decide otherwise
    (the weight then jumps between 0 and a fitted value)."""
    base = otb_part(groups)
    tree = tree_part(groups)
    move = [[[a - b for a, b in zip(t_row, o_row)] for t_row, o_row in zip(tg, og)] for tg, og in zip(tree, base)]
    stats, sizes, spread, largest = _weight_statistics(groups, base, move)

    def near(value: float, threshold: float) -> bool:
        return threshold / factor < abs(value) < threshold * factor

    if any(usable and largest > 0 and near(z / largest, SIZE_FLOOR) for z, usable in zip(sizes, spread)):
        return True
    return near(sum(square for group in stats for _, square in group), BELOW_FLOOR)


def tree_weight_of(groups: list[list[Response]], base, move, confidence=1.0) -> float:
    """``tree_weight: auto``: the one weight of the batch, fitted on the variance estimates
    of every informative group (docs/estimators.md), less its standard error over the
    kernel's units."""
    units = [unit for group in _weight_statistics(groups, base, move)[0] for unit in group]
    below = sum(square for _, square in units)
    if below <= BELOW_FLOOR:
        return 0.0
    fitted = -sum(cross for cross, _ in units) / below
    error = math.sqrt(sum((cross + fitted * square) ** 2 for cross, square in units)) / below
    return min(1.0, max(0.0, fitted - confidence * error))


def tree_otb(groups: list[list[Response]], fork_budget=2, min_group=2, horizon="shortest", shrink=4.0,
             scale="batch_std", std_floor=0.0, eps=1e-6, own_share=True, prefix_mean=True,
             ridge=0.025, tree_weight="auto") -> list[list[list[float]]]:
    """Advantages of every group of one batch: OTB's advantage plus ``λ`` times the step
    to the prefix tree's, ``λ`` fixed or fitted on the batch's responses."""
    tree = tree_part(groups, fork_budget, min_group, horizon, shrink, scale, std_floor, eps, own_share, prefix_mean,
                     ridge)
    if tree_weight == 1:
        return tree
    base = otb_part(groups, scale, std_floor, eps, own_share, prefix_mean)
    move = [[[a - b for a, b in zip(t_row, o_row)] for t_row, o_row in zip(tg, og)] for tg, og in zip(tree, base)]
    lam = tree_weight_of(groups, base, move) if tree_weight == "auto" else tree_weight
    out = []
    for g, group in enumerate(groups):
        rows = []
        for j, r in enumerate(group):
            row = []
            for t in range(len(r.tokens)):
                row.append(base[g][j][t] + lam * move[g][j][t])
            rows.append(row)
        out.append(rows)
    return out
