"""A slow, obvious reference of the four estimators, written from the spec alone.

Plain lists and loops, one group at a time; nothing here is shared with the package.
Each function takes one group, a list of ``Response``, and returns ``Result``: the raw
or normalised advantages per response, the selected boundaries and the nodes as
``(position, sorted member indices, value)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Response:
    tokens: list[int]
    reward: float
    surprisal: list[float] = field(default_factory=list)


@dataclass
class Result:
    advantages: list[list[float]]
    boundaries: list[int]
    nodes: list[tuple[int, tuple[int, ...], float]]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def sample_std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# ---------------------------------------------------------------------------- GRPO
def grpo(group: list[Response], std_floor: float = 0.0, eps: float = 1e-6, scale_rewards: bool = True) -> Result:
    rewards = [r.reward for r in group]
    v0 = mean(rewards)
    scale = max(sample_std(rewards), std_floor) + eps if scale_rewards else 1.0
    advantages = [[(r.reward - v0) / scale] * len(r.tokens) for r in group]
    return Result(advantages, [], [])


# ---------------------------------------------------------------------------- boundaries
def leaf_boundaries(group: list[Response], budget: int, horizon: str = "shortest") -> list[int]:
    lmin = min(len(r.tokens) for r in group)
    delta = max(2, lmin // (budget + 1))
    candidates = []
    for i, r in enumerate(group):
        limit = lmin if horizon == "shortest" else len(r.tokens)
        for t in range(1, limit):
            candidates.append((r.surprisal[t], i, t))
    candidates.sort(key=lambda c: (-c[0], c[2], c[1]))  # descending z, then smaller t, smaller i
    accepted: list[int] = []
    for _, _, t in candidates:
        if len(accepted) == budget:
            break
        if all(abs(t - p) >= delta for p in accepted):
            accepted.append(t)
    return sorted(accepted)


def collision_boundaries(group: list[Response], budget: int) -> list[int]:
    k = len(group)
    lmin = min(len(r.tokens) for r in group)
    delta = max(2, lmin // (budget + 1))
    scored = []
    for p in range(1, lmin):
        counts: dict[tuple[int, ...], int] = {}
        for r in group:
            key = tuple(r.tokens[:p])
            counts[key] = counts.get(key, 0) + 1
        kappa = sum((n / k) ** 2 for n in counts.values())
        scored.append((kappa, p))
    scored.sort(key=lambda c: (-c[0], c[1]))
    accepted: list[int] = []
    for _, p in scored:
        if len(accepted) == budget:
            break
        if all(abs(p - q) >= delta for q in accepted):
            accepted.append(p)
    return sorted(accepted)


# ---------------------------------------------------------------------------- nodes
def prefix_key(r: Response, p: int) -> tuple[int, ...]:
    """y[:p]; a response of at most p tokens is keyed by its whole sequence."""
    return tuple(r.tokens[:p])


def boundary_nodes(group: list[Response], boundaries: list[int], min_group: int) -> list[tuple[int, tuple[int, ...], float]]:
    nodes = []
    for p in boundaries:
        classes: dict[tuple, list[int]] = {}
        for i, r in enumerate(group):
            classes.setdefault(prefix_key(r, p), []).append(i)
        for members in classes.values():
            if len(members) >= min_group:
                nodes.append((p, tuple(members), mean([group[i].reward for i in members])))
    return nodes


def trie_nodes(group: list[Response], min_group: int) -> list[tuple[int, tuple[int, ...], float]]:
    """Every set S of responses that is exactly the set sharing some prefix u, together
    with d(S), the first position at which two members differ or a member ends."""
    sets: dict[tuple[int, ...], int] = {}
    for r in group:
        for p in range(0, len(r.tokens) + 1):
            members = tuple(
                j for j, other in enumerate(group) if other.tokens[:p] == r.tokens[:p] and len(other.tokens) >= p
            )
            if len(members) < min_group:
                continue
            sets[members] = split_depth([group[j].tokens for j in members])
    nodes = []
    for members, depth in sets.items():
        if depth == 0:  # the root itself
            continue
        nodes.append((depth, members, mean([group[i].reward for i in members])))
    return nodes


def split_depth(sequences: list[list[int]]) -> int:
    t = 0
    while True:
        if any(len(s) <= t for s in sequences):
            return t
        if len({s[t] for s in sequences}) > 1:
            return t
        t += 1


# ---------------------------------------------------------------------------- credit
def span_credit(
    group: list[Response],
    nodes: list[tuple[int, tuple[int, ...], float]],
    terms: str = "both",
    normalize: str = "span",
) -> list[list[float]]:
    v0 = mean([r.reward for r in group])
    per_response_spans: list[list[tuple[int, int, float]]] = []  # (start, end, value)
    for i, r in enumerate(group):
        path = sorted((n for n in nodes if i in n[1]), key=lambda n: (n[0], -len(n[1])))
        spans = []
        previous_value, previous_position = v0, 0
        for position, members, value in path:
            ga, la = value - v0, value - previous_value
            term = {"both": ga + la, "global": ga, "local": la}[terms]
            spans.append((previous_position, position, term / math.sqrt(len(members))))
            previous_value, previous_position = value, position
        tail_ga, tail_la = r.reward - v0, r.reward - previous_value
        tail = {"both": tail_ga + tail_la, "global": tail_ga, "local": tail_la}[terms]
        spans.append((previous_position, len(r.tokens), tail))
        per_response_spans.append(spans)
    raw = []
    for r, spans in zip(group, per_response_spans):
        row = [0.0] * len(r.tokens)
        for start, end, value in spans:
            for t in range(start, min(end, len(r.tokens))):  # a span past the end holds no token
                row[t] = value
        raw.append(row)
    if normalize == "none":
        return raw
    if normalize == "span":
        # every span on the path with p(v_j) > p(v_{j-1}), also one past a short
        # response's end; the tail when p(v_q) < H_i
        entries = [v for spans in per_response_spans for s, e, v in spans if s < e]
    elif normalize == "token":
        entries = [v for row in raw for v in row]
    else:
        raise ValueError("batch normalisation is done over the batch by `batch_normalise`")
    m = mean(entries) if entries else 0.0
    std = max(sample_std(entries), 1e-6)
    return [[(v - m) / std for v in row] for row in raw]


def batch_normalise(rows: list[list[float]]) -> list[list[float]]:
    values = [v for row in rows for v in row]
    m = mean(values) if values else 0.0
    std = max(sample_std(values), 1e-6)
    return [[(v - m) / std for v in row] for row in rows]


# ---------------------------------------------------------------------------- estimators
def leaf(group, fork_budget=2, min_group=2, horizon="shortest", terms="both", normalize="span") -> Result:
    boundaries = leaf_boundaries(group, fork_budget, horizon)
    nodes = boundary_nodes(group, boundaries, min_group)
    return Result(span_credit(group, nodes, terms, normalize), boundaries, nodes)


def collision(group, fork_budget=2, min_group=2, terms="both", normalize="span") -> Result:
    boundaries = collision_boundaries(group, fork_budget)
    nodes = boundary_nodes(group, boundaries, min_group)
    return Result(span_credit(group, nodes, terms, normalize), boundaries, nodes)


def full_tree(group, min_group=2, terms="both", normalize="span") -> Result:
    nodes = trie_nodes(group, min_group)
    return Result(span_credit(group, nodes, terms, normalize), [], nodes)


ESTIMATORS = {"grpo": grpo, "leaf": leaf, "collision": collision, "full_tree": full_tree}


def estimate_groups(groups: list[list[Response]], estimator: str, **params) -> list[Result]:
    """Every group on its own; ``normalize="batch"`` z-scores all tokens of all groups."""
    batch_wide = params.get("normalize") == "batch"
    if batch_wide:
        params = {**params, "normalize": "none"}
    results = [ESTIMATORS[estimator](group, **params) for group in groups]
    if batch_wide:
        rows = batch_normalise([row for result in results for row in result.advantages])
        for result in results:
            result.advantages, rows = rows[: len(result.advantages)], rows[len(result.advantages) :]
    return results
