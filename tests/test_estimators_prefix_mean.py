"""``tree_otb``'s prefix means and ridge: hand-worked values, and the batch gradient kept.

The slow reference of the whole estimator (tests/reference_tree_baselines.py, compared in
test_estimators_tree_baselines.py) covers every parameter together; these tests pin the
two ideas down on their own.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leaf_plugins as lp
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.estimators.tree_otb.prefix_intervals import PathIntervals, shared_prefix_lengths


def test_prefix_means_by_hand():
    """The tree's advantage (``tree_weight: 1``). One group, no node (B = 0), one kind of
    state, no own share, three responses of three tokens: each response's others weigh
    alike, so κ = 1 and the unaveraged advantage is r_i − (leave-one-out mean). Rewards
    1, 0, 0.5: those are 0.75, −0.75, 0. Token 0: all three share [1]: mean 0. Token 1:
    responses 0 and 1 share [1, 2]: mean 0; response 2 ([1, 5, 6]) is alone: 0. Token 2:
    each alone."""
    batch = lp.RolloutBatch.from_lists([[1, 2, 3], [1, 2, 4], [1, 5, 6]], [1.0, 0.0, 0.5], [0, 0, 0],
                                       surprisal=[[1, 1, 1]] * 3, logprobs=[[math.log(0.5)] * 3] * 3,
                                       sum_pi_squared=[[0.5] * 3] * 3)
    tree = {"fork_budget": 0, "own_share": False, "scale": "none", "tree_weight": 1.0}
    # float32 advantages of size <= 1 rounded from float64 class means (about 6e-8): 1e-6 below
    plain = lp.estimate(batch, "tree_otb", prefix_mean=False, **tree).advantages
    assert plain[:, 0].tolist() == pytest.approx([0.75, -0.75, 0.0], abs=1e-6)
    got = lp.estimate(batch, "tree_otb", **tree).advantages
    assert got[0].tolist() == pytest.approx([0.0, 0.0, 0.75], abs=1e-6)
    assert got[1].tolist() == pytest.approx([0.0, 0.0, -0.75], abs=1e-6)
    assert got[2].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_ridge_by_hand():
    """The tree's advantage (``tree_weight: 1``). Every token in one bin of 1 − Σπ² (0.5).
    Group 0: rewards 1 and 3, π = 0.5 (w = 0.5). Group 1: π = 0.5 (w = 0.5, reward 1) and
    π = 0.2 (w = 1.1, reward 0), mean 0.5. Response 0 learns from the three others:
    f = 0 and κ = Σ(w + ρ)(r − f) / Σ(w + ρ)(r̄ − f), its own group's mean without it
    being 3: κ = ((0.5 + ρ) 3 + (0.5 + ρ) 1) / ((0.5 + ρ) 3 + (0.5 + ρ) 0.5 + (1.1 + ρ) 0.5),
    2 / 2.3 at ridge ρ = 0, 6 / 6.3 at ρ = 1. With no node its value is the other's
    reward 3: A = 1 − 3κ."""
    batch = lp.RolloutBatch.from_lists([[1], [2], [1], [2]], [1.0, 3.0, 1.0, 0.0], [0, 0, 1, 1],
                                       surprisal=[[1]] * 4,
                                       logprobs=[[math.log(0.5)], [math.log(0.5)], [math.log(0.5)], [math.log(0.2)]],
                                       sum_pi_squared=[[0.5]] * 4)
    for ridge, kappa in ((0.0, 2 / 2.3), (1.0, 6 / 6.3)):
        got = lp.estimate(batch, "tree_otb", fork_budget=0, own_share=False, ridge=ridge, scale="none",
                          tree_weight=1.0).advantages
        # κ from float32 weights of size ~1 (about 1e-7 relative), times 3, then a float32 advantage: 1e-6
        assert got[0, 0].item() == pytest.approx(1 - 3 * kappa, abs=1e-6)


def consistent_policy_batch(seed: int) -> lp.RolloutBatch:
    """Groups whose responses share prefixes, with π and Σπ² a function of the prefix
    (as a real policy's are), so that tokens of one prefix class have one score."""
    rng = random.Random(seed)
    tokens, rewards, group_ids, logprobs, squares = [], [], [], [], []
    for group in range(rng.randint(1, 4)):
        trunk = [rng.randint(0, 3) for _ in range(6)]
        for _ in range(rng.randint(1, 6)):
            cut = rng.randint(0, 6)
            row = trunk[:cut] + [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]
            tokens.append(row)
            rewards.append(rng.choice([0.0, 0.25, 1.0, rng.random()]))
            group_ids.append(group)
            policy = [random.Random(hash((seed, group, tuple(row[: t + 1])))) for t in range(len(row))]
            probability = [p.choice([1.0, p.uniform(0.05, 0.99)]) for p in policy]
            logprobs.append([math.log(p) for p in probability])
            squares.append([p * p + (1 - p) ** 2 * 0.5 for p in probability])
    return lp.RolloutBatch.from_lists(tokens, rewards, group_ids, surprisal=[[-x for x in row] for row in logprobs],
                                      logprobs=logprobs, sum_pi_squared=squares)


def prefix_classes(batch: lp.RolloutBatch) -> list[tuple[int, int, tuple]]:
    """``(response, position, class)`` of every real token: the class is (group,
    position, the exact prefix through it)."""
    tokens = []
    for i in range(batch.size):
        row = batch.tokens[i, : int(batch.lengths[i])].tolist()
        tokens += [(i, t, (int(batch.groups.index[i]), t, tuple(row[: t + 1]))) for t in range(len(row))]
    return tokens


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), own_share=st.booleans(), fork_budget=st.integers(0, 3))
def test_prefix_means_keep_the_batch_gradient(seed, own_share, fork_budget):
    """Tokens with the same prefix through them have the same score, so the batch
    gradient is a function of the per-class sums: they must not change, and every token
    of a class gets the same advantage. At a fixed tree weight: the learnt one's standard
    error is taken over units that include single pairs of responses, whose terms the
    averaging changes (their sum it keeps)."""
    batch = consistent_policy_batch(seed)
    params = {"own_share": own_share, "fork_budget": fork_budget, "tree_weight": 0.5}
    plain = lp.estimate(batch, "tree_otb", prefix_mean=False, **params).advantages
    averaged = lp.estimate(batch, "tree_otb", **params).advantages
    tokens = prefix_classes(batch)
    before, after, counts = {}, {}, {}
    for i, t, key in tokens:
        before[key] = before.get(key, 0.0) + float(plain[i, t])
        after[key] = after.get(key, 0.0) + float(averaged[i, t])
        counts[key] = counts.get(key, 0) + 1
    for key in before:
        assert after[key] == pytest.approx(before[key], abs=2e-5), key
    for i, t, key in tokens:
        assert float(averaged[i, t]) == pytest.approx(after[key] / counts[key], abs=2e-5)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_shared_prefix_lengths_are_every_pairs_longest_common_prefix(seed):
    batch = consistent_policy_batch(seed)
    shared, partners = shared_prefix_lengths(batch)
    rows = [batch.tokens[i, : int(batch.lengths[i])].tolist() for i in range(batch.size)]
    for i in range(batch.size):
        group = int(batch.groups.index[i])
        members = [j for j in range(batch.size) if int(batch.groups.index[j]) == group]
        assert sorted(int(p) for p, s in zip(partners[i], shared[i]) if s >= 0) == members
        for partner, length in zip(partners[i].tolist(), shared[i].tolist()):
            if length < 0:
                continue
            a, b = rows[i], rows[partner]
            # one a prefix of the other: they part where the shorter one's padding starts
            common = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert length == (batch.width if a == b else common)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.integers(1, 40), events=st.integers(0, 6))
def test_token_cells_count_the_events_at_or_before_each_token(seed, width, events):
    """``interval · count + kind`` for every token, the interval the number of events at
    or before it, against a loop over tokens: events at position 0, at the width (they
    start nothing), repeated (an empty interval) and in any row."""
    generator = torch.Generator().manual_seed(seed)
    rows, count = 5, 8
    starts = torch.randint(0, width + 1, (rows, events), generator=generator).sort(dim=1).values  # [N, E]
    kinds = torch.randint(0, count, (rows, width), generator=generator, dtype=torch.int32)  # [N, T]
    intervals = PathIntervals(starts, torch.zeros(rows, events + 1, dtype=torch.int64),
                              torch.zeros(rows, 1, dtype=torch.int64), torch.ones(rows, events + 1, 1, dtype=torch.bool))
    work = torch.full((rows, width), 123, dtype=torch.int32)  # stale contents: token_cells must overwrite them
    out = torch.full((rows, width), -5, dtype=torch.int64)
    cells = intervals.token_cells(kinds, count, work, out)
    assert cells is out and cells.dtype == torch.int64
    expected = [[sum(int(e) <= t for e in starts[i]) * count + int(kinds[i, t]) for t in range(width)]
                for i in range(rows)]
    assert cells.tolist() == expected


@pytest.mark.parametrize("params, message", [
    ({"prefix_mean": "yes"}, "prefix_mean must be true or false"),
    ({"ridge": -0.1}, "ridge must be a finite number >= 0"),
    ({"ridge": float("inf")}, "ridge must be a finite number >= 0"),
    ({"ridge": True}, "ridge must be a number, got True"),
])
def test_bad_prefix_mean_and_ridge_are_named(params, message):
    with pytest.raises(ConfigError, match=message):
        lp.Engine("tree_otb", params)
