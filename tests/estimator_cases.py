"""Shared helpers of the estimator tests: random grouped batches with shared prefixes,
and the comparison of the package's output with the reference's."""

from __future__ import annotations

import random

import torch
from hypothesis import strategies as st

import leaf_plugins as lp
from reference_estimators import Response, estimate_groups

# Parameter grids each estimator accepts (every combination is exercised somewhere).
PARAMETER_GRID = {
    "grpo": [{}, {"std_floor": 1 / 3}, {"eps": 1e-3}, {"scale_rewards": False}],
    "leaf": [
        {"fork_budget": b, "min_group": m, "horizon": h, "terms": t, "normalize": n}
        for b in (0, 1, 2, 4)
        for m in (2, 3)
        for h in ("shortest", "each")
        for t in ("both", "global", "local")
        for n in ("none", "span", "token", "batch")
    ],
    "collision": [
        {"fork_budget": b, "min_group": m, "terms": t, "normalize": n}
        for b in (0, 1, 2, 3)
        for m in (2, 3)
        for t in ("both", "global", "local")
        for n in ("none", "span", "token", "batch")
    ],
    "full_tree": [
        {"min_group": m, "terms": t, "normalize": n}
        for m in (2, 3)
        for t in ("both", "global", "local")
        for n in ("none", "span", "token", "batch")
    ],
}


def random_groups(seed: int, max_groups: int = 4, max_k: int = 7, max_len: int = 12, vocab: int = 3) -> list[list[Response]]:
    """Groups whose responses branch off a shared trunk at random depths, so prefixes are
    really shared; lengths from 1; surprisal with frequent ties."""
    rng = random.Random(seed)
    groups = []
    for _ in range(rng.randint(1, max_groups)):
        trunk = [rng.randrange(vocab) for _ in range(max_len)]
        group = []
        for _ in range(rng.randint(1, max_k)):
            group.append(_branching_response(rng, trunk, rng.randint(1, max_len), vocab))
        groups.append(group)
    return groups


def _branching_response(rng: random.Random, trunk: list[int], length: int, vocab: int) -> Response:
    """A response of ``length`` tokens that leaves ``trunk`` at a random depth; a reward
    and a surprisal with frequent ties."""
    cut = rng.randint(0, length)
    tokens = trunk[:cut] + [rng.randrange(vocab) for _ in range(length - cut)]
    reward = rng.choice([0.0, 0.5, 1.0, round(rng.random(), 3)])
    surprisal = [rng.choice([0.1, 0.7, 2.0, rng.random() * 3]) for _ in tokens]
    return Response(tokens, reward, surprisal)


def groups_with_short_twins(seed: int, max_groups: int = 4, max_k: int = 8, max_len: int = 12) -> list[list[Response]]:
    """Groups with identical short responses (copies of one short sequence, equal or
    different rewards) beside long ones sharing a trunk: under ``horizon: each`` the short
    copies sit in nodes at boundaries past their end."""
    rng = random.Random(seed)
    groups = []
    for _ in range(rng.randint(1, max_groups)):
        trunk = [rng.randrange(3) for _ in range(max_len)]
        group = []
        for _ in range(rng.randint(1, 3)):  # kinds of short response, each copied 1-3 times
            short = trunk[: rng.randint(0, 2)] + [rng.randrange(3) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(1, 3)):
                reward = rng.choice([0.0, 1.0, round(rng.random(), 3)])
                group.append(Response(list(short), reward, [rng.choice([0.1, 2.0, rng.random() * 3]) for _ in short]))
        for _ in range(rng.randint(1, max(1, max_k - len(group)))):
            group.append(_branching_response(rng, trunk, rng.randint(max_len // 2, max_len), 3))
        rng.shuffle(group)
        groups.append(group)
    return groups


group_seeds = st.integers(min_value=0, max_value=2**31 - 1)


def to_batch(groups: list[list[Response]], group_ids: list[int] | None = None, shuffle_seed: int | None = None):
    """The groups as one RolloutBatch (optionally with responses interleaved), and the
    batch row of every (group, response) pair."""
    rows = [(g, i) for g, group in enumerate(groups) for i in range(len(group))]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    ids = group_ids or list(range(len(groups)))
    batch = lp.RolloutBatch.from_lists(
        [groups[g][i].tokens for g, i in rows],
        [groups[g][i].reward for g, i in rows],
        [ids[g] for g, i in rows],
        surprisal=[groups[g][i].surprisal for g, i in rows],
    )
    where = {pair: row for row, pair in enumerate(rows)}
    return batch, where


def assert_matches_reference(groups, estimator: str, params: dict, shuffle_seed: int | None = None) -> None:
    """The package and the reference agree on advantages, boundaries and nodes."""
    batch, where = to_batch(groups, shuffle_seed=shuffle_seed)
    result = lp.estimate(batch, estimator, **params)
    expected = estimate_groups(groups, estimator, **params)
    advantages = result.advantages
    assert advantages.dtype == torch.float32
    assert bool((advantages[~batch.mask] == 0).all()), "padding must be exactly 0"
    assert bool(torch.isfinite(advantages).all())
    for g, reference in enumerate(expected):
        for i, row in enumerate(reference.advantages):
            got = advantages[where[(g, i)], : len(row)].double()
            assert torch.allclose(got, torch.tensor(row, dtype=torch.float64), atol=2e-5, rtol=1e-4), (
                f"{estimator} {params} group {g} response {i}: expected {row}, got {got.tolist()}"
            )
        if estimator in ("leaf", "collision"):
            assert result.boundaries[g] == reference.boundaries, (estimator, params, g)
        if estimator == "grpo":
            continue
        expected_nodes = sorted(
            (position, tuple(sorted(where[(g, m)] for m in members)), value) for position, members, value in reference.nodes
        )
        actual_nodes = sorted((n.position, n.members, n.value) for n in result.nodes[g])
        assert [n[:2] for n in actual_nodes] == [n[:2] for n in expected_nodes], (estimator, params, g)
        for (_, _, got_value), (_, _, want_value) in zip(actual_nodes, expected_nodes):
            assert abs(got_value - want_value) < 1e-5


def refuse_exact_sort(monkeypatch, message: str) -> None:
    """Make the exact lexicographic sort (the fallback after a failed hash proof) raise
    ``AssertionError(message)``: the hashes alone must decide."""
    from leaf_plugins.estimators.machinery import prefixes

    def refused(cls, batch):
        raise AssertionError(message)

    monkeypatch.setattr(prefixes.SortedPrefixes, "lexicographic_exact", classmethod(refused))


def collide_hashes_and_count_exact_sorts(monkeypatch) -> list[int]:
    """Set every hash multiplier to 1 (a prefix then hashes to its token sum, so [1, 2]
    and [2, 1] collide) and record the batch size of every exact sort that follows."""
    from leaf_plugins.estimators.machinery import prefixes

    exact_sorts: list[int] = []
    exact = prefixes.SortedPrefixes.lexicographic_exact.__func__

    def counted(cls, batch):
        exact_sorts.append(batch.size)
        return exact(cls, batch)

    monkeypatch.setattr(prefixes, "_odd_multipliers", lambda width, dtype, device: torch.ones(width, dtype=dtype))
    monkeypatch.setattr(prefixes.SortedPrefixes, "lexicographic_exact", classmethod(counted))
    return exact_sorts
