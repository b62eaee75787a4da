"""Every estimator against the slow reference, and every invariant of the spec, on random
ragged batches with shared prefixes."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leaf_plugins as lp
from estimator_cases import (PARAMETER_GRID, assert_matches_reference, collide_hashes_and_count_exact_sorts, group_seeds,
                             groups_with_short_twins, random_groups, refuse_exact_sort, to_batch)
from reference_estimators import Response

ESTIMATORS = ["grpo", "leaf", "collision", "full_tree"]
TREE_ESTIMATORS = ["leaf", "collision", "full_tree"]
FAST = settings(max_examples=40, deadline=None)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(seed=group_seeds, choice=st.integers(min_value=0, max_value=10**6), shuffle=st.booleans())
def test_matches_the_reference(estimator, seed, choice, shuffle):
    params = PARAMETER_GRID[estimator][choice % len(PARAMETER_GRID[estimator])]
    assert_matches_reference(random_groups(seed), estimator, params, shuffle_seed=seed if shuffle else None)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(seed=group_seeds, choice=st.integers(min_value=0, max_value=10**6))
def test_matches_the_reference_on_uniform_groups(estimator, seed, choice):
    """Groups of one size stored contiguously: the layout the trainer produces, which
    the estimators handle without scatters (views of [G, K, T])."""
    groups = random_groups(seed, max_k=5)
    size = min(len(group) for group in groups)
    groups = [group[:size] for group in groups]
    assert to_batch(groups)[0].groups.uniform_size == size
    params = PARAMETER_GRID[estimator][choice % len(PARAMETER_GRID[estimator])]
    assert_matches_reference(groups, estimator, params)


@FAST
@given(seed=group_seeds, budget=st.sampled_from([1, 2, 3, 4]), min_group=st.sampled_from([2, 3]),
       terms=st.sampled_from(["both", "global", "local"]), shuffle=st.booleans())
def test_leaf_each_horizon_span_normalisation_matches_the_reference_with_short_twins(seed, budget, min_group, terms,
                                                                                     shuffle):
    """The authors' rule (spec, LEAF step 4): spans wholly past a short response's end,
    between two nodes that hold its identical copies, are entries of the z-score."""
    params = {"fork_budget": budget, "min_group": min_group, "horizon": "each", "terms": terms, "normalize": "span"}
    assert_matches_reference(groups_with_short_twins(seed), "leaf", params, shuffle_seed=seed if shuffle else None)


def test_short_twins_do_reach_nodes_past_their_end():
    """The generator above really exercises the rule: over its first seeds, many groups
    have a node past the end of one of its members."""
    past_end = 0
    for seed in range(60):
        groups = groups_with_short_twins(seed)
        batch, _ = to_batch(groups)
        result = lp.estimate(batch, "leaf", fork_budget=4, horizon="each")
        for nodes in result.nodes:
            past_end += any(n.position > min(batch.lengths[m].item() for m in n.members) for n in nodes)
    assert past_end >= 10


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_matches_the_reference_on_every_parameter_combination(estimator):
    for index, params in enumerate(PARAMETER_GRID[estimator]):
        assert_matches_reference(random_groups(index, max_groups=3, max_k=6), estimator, params, shuffle_seed=index)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(seed=group_seeds)
def test_permuting_a_group_permutes_the_output(estimator, seed):
    groups = random_groups(seed)
    batch, where = to_batch(groups)
    permuted, where_permuted = to_batch(groups, shuffle_seed=seed + 1)
    params = {"normalize": "none"} if estimator != "grpo" else {}
    a = lp.estimate(batch, estimator, **params).advantages
    b = lp.estimate(permuted, estimator, **params).advantages
    for pair, row in where.items():
        assert torch.allclose(a[row], b[where_permuted[pair]], atol=1e-6)


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
@FAST
@given(seed=group_seeds, shift=st.floats(-3, 3), scale=st.floats(0.1, 10))
def test_raw_advantages_ignore_reward_shifts_and_follow_scales(estimator, seed, shift, scale):
    batch, _ = to_batch(random_groups(seed))
    raw = lp.estimate(batch, estimator, normalize="none").advantages
    shifted = lp.estimate(batch.with_rewards(batch.rewards + shift), estimator, normalize="none").advantages
    scaled = lp.estimate(batch.with_rewards(batch.rewards * scale), estimator, normalize="none").advantages
    assert torch.allclose(shifted, raw, atol=1e-4)
    assert torch.allclose(scaled, raw * scale, atol=1e-4, rtol=1e-4)


@FAST
@given(seed=group_seeds)
def test_leaf_with_no_budget_is_twice_the_centred_reward(seed):
    batch, _ = to_batch(random_groups(seed))
    result = lp.estimate(batch, "leaf", fork_budget=0, normalize="none")
    root = torch.zeros(batch.groups.count).index_add_(0, batch.groups.index, batch.rewards) / batch.groups.sizes
    expected = 2 * (batch.rewards - root[batch.groups.index])
    assert torch.allclose(result.advantages, expected.unsqueeze(1) * batch.mask, atol=1e-6)
    assert result.boundaries == [[] for _ in range(batch.groups.count)]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(seed=group_seeds)
def test_groups_never_leak_into_each_other(estimator, seed):
    groups = random_groups(seed)
    together, where = to_batch(groups, shuffle_seed=seed)
    combined = lp.estimate(together, estimator).advantages
    for g, group in enumerate(groups):
        alone, _ = to_batch([group])
        single = lp.estimate(alone, estimator).advantages
        for i, response in enumerate(group):
            width = len(response.tokens)
            assert torch.allclose(combined[where[(g, i)], :width], single[i, :width], atol=1e-5)


EDGE_CASES = {
    "one response": [[Response([1, 2, 3], 0.7, [1.0, 2.0, 3.0])]],
    "all rewards equal": [[Response([1, 2, 3], 0.5, [1, 2, 3]), Response([1, 3, 3], 0.5, [3, 2, 1])]],
    "all responses identical": [[Response([4, 4, 4], r, [1, 1, 1]) for r in (0.0, 1.0, 0.5)]],
    "length one": [[Response([1], 1.0, [2.0]), Response([2], 0.0, [1.0]), Response([1], 0.5, [0.5])]],
    "no candidates (lmin 1)": [[Response([1], 1.0, [2.0]), Response([1, 2, 3, 4], 0.0, [1, 2, 3, 4])]],
    "empty response": [[Response([], 1.0, []), Response([1, 2], 0.0, [1.0, 1.0])]],
    "all responses empty": [[Response([], 1.0, []), Response([], 0.0, [])], [Response([], 0.5, [])]],
    "no responses at all": [],
}


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("normalize", ["none", "span", "token", "batch"])
def test_edge_cases_are_defined_and_match_the_reference(estimator, case, normalize):
    params = {} if estimator == "grpo" else {"normalize": normalize}
    assert_matches_reference(EDGE_CASES[case], estimator, params)


def test_collision_is_shallower_than_leaf_on_boilerplate_openings():
    """Every response opens with the same 6 boilerplate tokens; the answer forks later at
    high-surprisal decision points. Collision mass peaks on the shared opening, so
    collision spends its budget there, while LEAF goes where the decisions are."""
    rng = random.Random(7)
    groups = []
    for _ in range(20):
        group = []
        for _ in range(8):
            decision_a, decision_b = rng.randrange(3), rng.randrange(3)
            tokens = [9, 9, 8, 8, 7, 7] + [decision_a, 1, 1, 1, 1] + [decision_b, 2, 2, 2, 2, 2]
            surprisal = [0.05] * 6 + [1.5] + [0.05] * 4 + [1.2] + [0.05] * 5
            group.append(Response(tokens, (decision_a == 0) * 0.6 + (decision_b == 1) * 0.4, surprisal))
        groups.append(group)
    batch, _ = to_batch(groups)
    leaf_depth = [p for group in lp.estimate(batch, "leaf").boundaries for p in group]
    collision_depth = [p for group in lp.estimate(batch, "collision").boundaries for p in group]
    assert sum(collision_depth) / len(collision_depth) < sum(leaf_depth) / len(leaf_depth)
    assert set(leaf_depth) == {6, 11}  # the decision points


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
def test_long_responses_without_the_exact_sort(estimator, monkeypatch):
    """Long rows with long shared prefixes: exact, and decided by the hashes alone (the
    exact sort is only for collisions)."""
    refuse_exact_sort(monkeypatch, "the hashes failed their exact check without a collision")
    for seed in range(12):
        groups = random_groups(seed, max_groups=3, max_k=6, max_len=150, vocab=2 + seed % 3)
        assert_matches_reference(groups, estimator, {"normalize": "none"} if seed % 2 else {})


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
def test_token_ids_beyond_31_bits(estimator):
    """Ids that do not fit the narrow (int32) hashes take the int64 ones, still exact."""
    for seed in range(20):
        # ids that differ only above bit 31, so that 32-bit arithmetic would confuse them
        groups = [[Response([2**40 + (token % 2) + (token // 2) * 2**32 for token in response.tokens], response.reward,
                            response.surprisal) for response in group] for group in random_groups(seed)]
        assert_matches_reference(groups, estimator, {"normalize": "none"} if seed % 2 else {})


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
def test_exact_when_prefix_hashes_collide(estimator, monkeypatch):
    """With every hash multiplier 1 a prefix hashes to its token sum, so [1, 2] and
    [2, 1] collide: the exact check must catch that and fall back to an exact sort."""
    exact_sorts = collide_hashes_and_count_exact_sorts(monkeypatch)
    swapped = [[Response([1, 2, 0, 1], 1.0, [0.1, 0.1, 3.0, 0.1]), Response([2, 1, 0, 0], 0.0, [0.1, 0.1, 3.0, 0.1]),
                Response([2, 1, 0, 2], 0.5, [0.1, 0.1, 3.0, 0.1])]]
    for groups in [swapped] + [random_groups(seed) for seed in range(30)]:
        for params in ({"normalize": "none"}, {"fork_budget": 4, "min_group": 3}):
            if estimator == "full_tree":
                params.pop("fork_budget", None)
            assert_matches_reference(groups, estimator, params)
    assert exact_sorts, "the colliding hashes were never caught"
