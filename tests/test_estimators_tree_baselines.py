"""tree_rloo and tree_otb: against the slow reference, by hand, invariants, and the
statistical bias test on the exact credit task."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import assume, given, settings

import leaf_plugins as lp
import reference_tree_baselines as reference
from estimator_cases import group_seeds, random_groups
from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.measures import gradient_bias
from leaf_plugins.bench.credit.sampling import sample_groups
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.estimators.tree_otb.mixing_weights import KernelTerms, kernel_terms, pooled_weight
from leaf_plugins.estimators.tree_otb.prefix_intervals import shared_prefix_lengths
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes
from reference_estimators import boundary_nodes, collision_boundaries, trie_nodes


def policy_groups(seed: int, **kwargs) -> list[list[reference.Response]]:
    """Random groups with shared prefixes (as the other estimator tests) and, per token,
    a log-probability and a Σπ² that some distribution has (π² <= Σπ² <= π² + (1-π)²),
    with near-deterministic and uncertain tokens mixed; all rounded to float32. As a
    policy's, they are a function of the prefix through the token: responses that share
    it share them."""
    rng = random.Random(seed)
    groups = []
    for group in random_groups(seed, **kwargs):
        drawn: dict[tuple[int, ...], tuple[float, float]] = {}
        rows = []
        for response in group:
            for t in range(len(response.tokens)):
                if tuple(response.tokens[: t + 1]) not in drawn:
                    pi = rng.choice([1.0, 0.999, 0.97, 0.6, rng.random() * 0.9 + 0.05])
                    drawn[tuple(response.tokens[: t + 1])] = (pi, pi * pi + (1 - pi) ** 2 * rng.random())
            pis, spread = zip(*(drawn[tuple(response.tokens[: t + 1])] for t in range(len(response.tokens))))
            rows.append(reference.Response(response.tokens, _float32(response.reward), response.surprisal,
                                           _float32([math.log(pi) for pi in pis]), _float32(list(spread))))
        groups.append(rows)
    return groups


def _float32(values):
    """The values the batch will hold (float32), so the reference reads the same inputs."""
    return torch.tensor(values, dtype=torch.float32).double().tolist()


def batch_of(groups, shuffle_seed: int | None = None):
    rows = [(g, i) for g, group in enumerate(groups) for i in range(len(group))]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    batch = lp.RolloutBatch.from_lists(
        [groups[g][i].tokens for g, i in rows], [groups[g][i].reward for g, i in rows], [g for g, _ in rows],
        surprisal=[groups[g][i].surprisal for g, i in rows], logprobs=[groups[g][i].logprobs for g, i in rows],
        sum_pi_squared=[groups[g][i].sum_pi_squared for g, i in rows],
    )
    return batch, {pair: row for row, pair in enumerate(rows)}


LEARNT_TOLERANCE = 1e-3
"""Absolute tolerance of advantages that use ``tree_otb``'s learnt weight against the
float64 reference (the learnt-weights test says why)."""


def assert_rows(advantages: torch.Tensor, where, expected: list[list[list[float]]], label: str,
                atol: float = 2e-5) -> None:
    assert advantages.dtype == torch.float32 and bool(torch.isfinite(advantages).all())
    for g, rows in enumerate(expected):
        for i, row in enumerate(rows):
            got = advantages[where[(g, i)]]
            assert torch.allclose(got[: len(row)].double(), torch.tensor(row, dtype=torch.float64), atol=atol,
                                  rtol=1e-4), f"{label} group {g} response {i}: expected {row}, got {got.tolist()}"
            assert bool((got[len(row):] == 0).all()), "padding must be exactly 0"


TREE_RLOO_GRID = [
    {"fork_budget": b, "min_group": m, "horizon": h, "shrink": s, "scale": c}
    for b, m, h, s, c in [(2, 2, "shortest", 4.0, "group_std"), (0, 2, "shortest", 4.0, "none"),
                          (4, 3, "each", 0.0, "none"), (1, 2, "each", 1.5, "group_std")]
]
TREE_OTB_GRID = [
    {"fork_budget": 2}, {"own_share": False}, {"shrink": 0.0, "scale": "none"},
    {"fork_budget": 4, "min_group": 3, "horizon": "each", "own_share": False, "shrink": 2.0},
    {"shrink": "auto"}, {"shrink": "auto", "fork_budget": 4, "horizon": "each", "own_share": False},
    {"prefix_mean": False, "ridge": 0.0}, {"prefix_mean": False, "own_share": False, "ridge": 0.3},
    {"ridge": 1.0, "scale": "group_std"}, {"fork_budget": 0, "ridge": 0.0}, {"scale": "none", "own_share": False},
    {"tree_weight": 1.0}, {"tree_weight": 0.0}, {"tree_weight": 0.4, "own_share": False, "prefix_mean": False},
    {"tree_weight": 1, "own_share": False, "shrink": "auto"},
]


@settings(max_examples=25, deadline=None)
@given(seed=group_seeds)
def test_tree_rloo_matches_the_reference(seed):
    groups = policy_groups(seed)
    batch, where = batch_of(groups, shuffle_seed=seed)
    for params in TREE_RLOO_GRID:
        expected = [reference.tree_rloo(group, **params) for group in groups]
        assert_rows(lp.estimate(batch, "tree_rloo", **params).advantages, where, expected, f"tree_rloo {params}")


@settings(max_examples=25, deadline=None)
@given(seed=group_seeds)
def test_tree_rloo_with_learnt_shrinkage_matches_the_reference(seed):
    groups = policy_groups(seed, max_groups=4)
    batch, where = batch_of(groups, shuffle_seed=seed)
    shrinks = reference.auto_shrinks(groups, [reference.tree_nodes(group, 2, 2, "shortest") for group in groups])
    expected = [reference.tree_rloo(group, shrink=s, scale="none") for group, s in zip(groups, shrinks)]
    assert_rows(lp.estimate(batch, "tree_rloo", shrink="auto", scale="none").advantages, where, expected, "auto")


def test_learnt_shrinkage_by_hand():
    """Two groups of 4 with one node each at position 1 (B = 1; responses 0–2 share their
    first token, response 3 does not). Group 0 rewards (1, 1, 0, 0): node mean 2/3,
    within-node squares 2·(1/3)² + (2/3)² = 2/3 on 2 degrees of freedom, parent (group)
    mean 1/2, noise share 1/3 − 1/4 = 1/12. Group 1 learns from group 0 alone:
    σ² = 1/3, τ² = (1/6)² − (1/3)(1/12) = 0, so s = 10⁶ (the node says nothing beyond
    the group). Group 1 rewards (1, 1, 1, 0): node mean 1, no within spread (σ² = 0 for
    group 0, which learns from group 1 alone), so group 0 keeps the fallback s = 4."""
    tokens = [[1, 2], [1, 3], [1, 4], [5, 6]] * 2
    batch = lp.RolloutBatch.from_lists(tokens, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], [0] * 4 + [1] * 4,
                                       surprisal=[[0.0, 1.0]] * 8)
    got = lp.estimate(batch, "tree_rloo", fork_budget=1, shrink="auto", scale="none").advantages
    # group 0, response 0, token 1 (in the node): others in the node (1, 0), s = 4 toward
    # the root LOO value (1 + 0 + 0)/3: V̂ = (1 + 4/3) / (2 + 4) = 7/18
    assert got[0, 1].item() == pytest.approx(1 - 7 / 18, abs=1e-6)
    # group 1, response 0: s = 10⁶ keeps the root LOO value (1 + 1 + 0)/3 in the node
    assert got[4, 1].item() == pytest.approx(1 - 2 / 3, abs=1e-5)


@settings(max_examples=25, deadline=None, derandomize=True)  # fixed examples: see the learnt-weights test below
@given(seed=group_seeds)
def test_tree_otb_matches_the_reference(seed):
    groups = policy_groups(seed)
    assume(not reference.weights_near_thresholds(groups))  # as in the learnt-weights test below
    batch, where = batch_of(groups, shuffle_seed=seed)
    for params in TREE_OTB_GRID:
        expected = reference.tree_otb(groups, **params)
        learnt = params.get("tree_weight", "auto") == "auto"  # its rounding tolerance: the learnt-weights test
        assert_rows(lp.estimate(batch, "tree_otb", **params).advantages, where, expected, f"tree_otb {params}",
                    atol=LEARNT_TOLERANCE if learnt else 2e-5)


@pytest.mark.parametrize("seed", range(20))
def test_tree_otb_nodes_read_off_the_order_equal_leafs(seed):
    """tree_otb retains its nodes from the lexicographic order its advantages read anyway;
    they are LEAF's nodes (found by prefix hashes), as with the order unused."""
    groups = policy_groups(seed)
    batch, _ = batch_of(groups, shuffle_seed=seed)
    leaf = lp.estimate(batch, "tree_rloo").node_table
    for params in ({}, {"prefix_mean": False, "tree_weight": 1.0}):  # from the order; by hashes
        nodes = lp.estimate(batch, "tree_otb", **params).node_table
        for field in ("group", "position", "value", "size", "path", "root_value"):
            assert torch.equal(getattr(nodes, field), getattr(leaf, field)), (params, field)


@pytest.mark.parametrize("stages", ["collision", "full_tree"])
def test_any_boundary_stage_gives_the_reference_on_its_nodes(stages):
    """Collision boundaries, or every branching set of the trie: the same baselines on
    those nodes."""
    for seed in range(12):
        groups = policy_groups(seed)
        batch, where = batch_of(groups)
        override = {"select_boundaries": "collision"} if stages == "collision" else {"retain_nodes": "full_tree"}
        for name in ("tree_rloo", "tree_otb"):
            got = lp.estimate(batch, name, stages=override, own_share=False, scale="none", prefix_mean=False,
                              ridge=0.0, tree_weight=1.0).advantages \
                if name == "tree_otb" else lp.estimate(batch, name, stages=override, scale="none").advantages
            expected = []
            for g, group in enumerate(groups):
                nodes = (boundary_nodes(group, collision_boundaries(group, 2), 2) if stages == "collision"
                         else trie_nodes(group, 2))
                values = [reference.token_values(group, i, nodes, 4.0) for i in range(len(group))]
                if name == "tree_rloo":
                    expected.append([[r.reward - v for v in row] for r, row in zip(group, values)])
                else:
                    ratios = [reference.kappas(groups, g, i) for i in range(len(group))]  # (f, κ) of each response
                    expected.append([
                        [0.0 if len(group) == 1 else
                         r.reward - floor - kappa[reference.bisect.bisect_left(reference.KAPPA_EDGES,
                                                                               1 - r.sum_pi_squared[t])] * (v - floor)
                         for t, v in enumerate(row)]
                        for r, row, (floor, kappa) in zip(group, values, ratios)])
            assert_rows(got, where, expected, f"{name} with {stages} nodes")


def test_tree_rloo_worked_example_from_the_docs():
    batch = lp.RolloutBatch.from_lists([[1, 2, 3], [1, 2, 4], [1, 5], [6]], [1.0, 0.0, 0.5, 0.2], [0] * 4,
                                       surprisal=[[0.1, 2, 0.3], [0.1, 2, 0.3], [0.1, 2], [1]])
    advantages = lp.estimate(batch, "tree_rloo").advantages
    for row, (value, length) in enumerate(zip([1.7627, -1.3029, 0.2299, -0.6898], [3, 3, 2, 1])):
        assert advantages[row, :length].tolist() == pytest.approx([value] * length, abs=1e-4)


def test_tree_rloo_by_hand_with_a_node():
    """K = 4, boundary at 2 (the only candidate with B = 1): responses 0, 1, 2 share
    [5, 7]. Response 0's others in the node: rewards 0 and 1; root LOO (0 + 1 + 0) / 3."""
    batch = lp.RolloutBatch.from_lists([[5, 7, 1], [5, 7, 2], [5, 7, 3], [6, 8, 4]], [1.0, 0.0, 1.0, 0.0], [0] * 4,
                                       surprisal=[[0, 0, 1], [0, 0, 1], [0, 0, 1], [0, 0, 1]])
    got = lp.estimate(batch, "tree_rloo", fork_budget=1, shrink=1.0, scale="none").advantages
    root = 1 / 3  # response 0: others 0, 1, 0
    node = (0 + 1 + 1.0 * root) / (2 + 1.0)
    assert got[0].tolist() == pytest.approx([1 - root, 1 - root, 1 - node], abs=1e-6)
    root3 = 2 / 3  # response 3: others 1, 0, 1; no node
    assert got[3].tolist() == pytest.approx([-root3] * 3, abs=1e-6)


def test_tree_otb_by_hand_ratio_and_floor():
    """Two groups of two. Every token uncertain (π = .5, Σπ² = .5: w = .5, bin 7). Each
    response learns from the three others: response 0 (reward 1) from 3 (its group, whose
    mean without it is 3) and 2, 4 (group 1, mean 3): f = 2, κ = Σw(r−f)/Σw(r̄−f) =
    (1 + 0 + 2)/(1 + 1 + 1) = 1, so b = V̂ = 3; response 3 (reward 4) from 2 (its group's
    mean without it, 2) and 1, 3 (mean 2): f = 1, κ = (1 + 0 + 2)/(1 + 1 + 1) = 1, b = 2."""
    def run(rewards):
        batch = lp.RolloutBatch.from_lists([[1, 2], [3, 4], [1, 2], [3, 4]], rewards, [0, 0, 1, 1],
                                           surprisal=[[1, 1]] * 4, logprobs=[[math.log(0.5)] * 2] * 4,
                                           sum_pi_squared=[[0.5, 0.5]] * 4)
        return lp.estimate(batch, "tree_otb", own_share=False, fork_budget=0, scale="none", tree_weight=1.0).advantages

    got = run([1.0, 3.0, 2.0, 4.0])
    assert got[0].tolist() == pytest.approx([1 - 3, 1 - 3], abs=1e-6)  # κ = 1: b = the other's reward
    assert got[3].tolist() == pytest.approx([4 - 2, 4 - 2], abs=1e-6)
    # a weight-less other group: its near-deterministic tokens (π = 1) carry no weight, κ = 1
    batch = lp.RolloutBatch.from_lists([[1], [2], [1], [2]], [0.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], surprisal=[[1]] * 4,
                                       logprobs=[[0.0], [0.0], [math.log(0.5)], [math.log(0.5)]],
                                       sum_pi_squared=[[1.0], [1.0], [0.5], [0.5]])
    got = lp.estimate(batch, "tree_otb", own_share=False, fork_budget=0, scale="none", tree_weight=1.0).advantages
    assert got[:, 0].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-6)


def test_tree_otb_ratio_below_one_moves_the_baseline_toward_the_floor():
    """Near-deterministic tokens (1 − Σπ² = .0198, bin 4), and ridge .025 added to every
    weight. Group 0: rewards 1 and .6, both π = .99 (w = 1 − 1.98 + .9802 = .0002, W = .0252).
    Group 1: the response that took a rare token (π = .1, w = 1.7802, W = 1.8052) got 0,
    the other (π = 1, Σπ² = 1: bin 0, no weight in bin 4) 1, mean .5. Response 0 learns
    from response 1 (its group's mean without it: .6) and group 1: f = 0,
    κ = (.0252 · .6 + 1.8052 · 0) / (.0252 · .6 + 1.8052 · .5) = .01512 / .91772, and with
    no node its baseline is κ times the other's reward .6. Response 1 likewise:
    κ = .0252 / (.0252 + .9026), baseline κ · 1. The rare, costly token of the other group
    pulls both baselines far below the value (κ ≈ .02)."""
    rare = [math.log(0.1)]
    batch = lp.RolloutBatch.from_lists(
        [[1], [2], [1], [2]], [1.0, 0.6, 0.0, 1.0], [0, 0, 1, 1], surprisal=[[1]] * 4,
        logprobs=[[math.log(0.99)], [math.log(0.99)], rare, [0.0]],
        sum_pi_squared=[[0.9802], [0.9802], [0.9802], [1.0]],
    )
    got = lp.estimate(batch, "tree_otb", own_share=False, fork_budget=0, scale="none", tree_weight=1.0).advantages
    # the weights are float32 sums of 1 − 2π + Σπ² near cancellation (w = 2e-4 from terms of
    # size 1, to about 1e-7 absolute): κ to about 1e-5 relative, the advantages to 1e-6
    assert got[0, 0].item() == pytest.approx(1.0 - 0.6 * 0.01512 / 0.91772, abs=2e-6)
    assert got[1, 0].item() == pytest.approx(0.6 - 1.0 * 0.0252 / 0.9278, abs=2e-6)


@pytest.mark.parametrize("name", ["tree_rloo", "tree_otb"])
def test_a_response_alone_and_an_all_equal_group(name):
    batch = lp.RolloutBatch.from_lists([[1, 2], [3], [4, 5], [4, 6]], [0.7, 0.3, 0.5, 0.5], [0, 1, 2, 2],
                                       surprisal=[[1, 1], [1], [1, 1], [1, 1]],
                                       logprobs=[[-0.5, -0.1], [-1.0], [-0.2, -0.3], [-0.2, -2.0]],
                                       sum_pi_squared=[[0.5, 0.9], [0.4], [0.7, 0.6], [0.7, 0.6]])
    for params in ({}, {"own_share": False}) if name == "tree_otb" else ({},):
        advantages = lp.estimate(batch, name, **params).advantages
        assert bool((advantages[1] == 0).all()), "a response alone gets 0"
    assert bool((lp.estimate(batch, "tree_rloo").advantages[2:] == 0).all()), "all-equal group: 0"


def test_tree_otb_all_equal_group_under_group_std_gets_zero_not_a_blowup():
    """Group 1 (rewards .5, .5) has no spread. Its baseline is measured from the lowest
    other reward f = .2 (not its own mean) with κ near 0: in the near-deterministic bin
    (ridge .025 added to every weight), its other response (W = .0252, its group's mean
    without the response .5) and group 0's response with the rare token (π = .1,
    W = 1.8052, scored .2 = f; the other has no weight in the bin, mean .55) give
    κ = .0252 · .3 / (.0252 · .3 + 1.8052 · .35), so its unscaled advantage is
    r − f − κ (.5 − f) ≈ .2965 on every token. Divided by GRPO's std + eps that would be
    .2965 / 1e-6; under ``group_std`` an all-equal group gets 0, as in GRPO, and
    ``scale: none`` keeps it."""
    batch = lp.RolloutBatch.from_lists(
        [[1], [2], [1], [2]], [0.2, 0.9, 0.5, 0.5], [0, 0, 1, 1], surprisal=[[1]] * 4,
        logprobs=[[math.log(0.1)], [0.0], [math.log(0.99)], [math.log(0.99)]],
        sum_pi_squared=[[0.9802], [1.0], [0.9802], [0.9802]],
    )
    unscaled = lp.estimate(batch, "tree_otb", own_share=False, fork_budget=0, scale="none", tree_weight=1.0).advantages
    kappa = 0.0252 * 0.3 / (0.0252 * 0.3 + 1.8052 * 0.35)
    # float32 weights near cancellation (w = 2e-4 from terms of size 1): κ to 1e-5 relative
    assert unscaled[2:, 0].tolist() == pytest.approx([0.3 - kappa * 0.3] * 2, abs=2e-6)
    scaled = lp.estimate(batch, "tree_otb", own_share=False, fork_budget=0, scale="group_std",
                         tree_weight=1.0).advantages
    assert scaled[2:].abs().max().item() == 0.0
    assert scaled[0, 0].item() == pytest.approx(unscaled[0, 0].item() / (0.7 / math.sqrt(2) + 1e-6), rel=1e-5)


def test_batch_std_divides_by_the_pooled_within_group_std_by_hand():
    """Rewards (1, 0) and (.5, .1): squares .5 and .08 over 1 + 1 degrees of freedom, so
    every advantage is divided by √.29 = .5385; with ``shrink: 0`` the leave-one-out
    advantages are ±1 and ±.4 (the second group's first response is alone on its second
    token: 0 there)."""
    batch = lp.RolloutBatch.from_lists([[1, 2], [1, 3], [4], [5, 6]], [1.0, 0.0, 0.5, 0.1], [0, 0, 1, 1],
                                       surprisal=[[0.1, 0.2], [0.1, 0.3], [0.5], [0.2, 0.2]])
    got = lp.estimate(batch, "tree_rloo", shrink=0.0, scale="batch_std").advantages
    unit = 1 / math.sqrt(0.29)
    expected = [unit, unit, -unit, -unit, 0.4 * unit, 0.0, -0.4 * unit, -0.4 * unit]  # row by row
    assert got.view(-1).tolist() == pytest.approx(expected, rel=1e-5)


def test_batch_std_of_a_batch_without_spread_is_zero_not_a_blowup():
    """Every group all-equal: the pooled std is 0, the divisor infinite and every
    advantage exactly 0, as GRPO's (not 0/0 or a value divided by eps)."""
    batch = lp.RolloutBatch.from_lists(
        [[1], [2], [1], [2]], [0.2, 0.2, 0.5, 0.5], [0, 0, 1, 1], surprisal=[[1]] * 4,
        logprobs=[[math.log(0.1)], [0.0], [math.log(0.99)], [math.log(0.99)]],
        sum_pi_squared=[[0.9802], [1.0], [0.9802], [0.9802]],
    )
    for name in ("tree_rloo", "tree_otb"):
        advantages = lp.estimate(batch, name, fork_budget=0, scale="batch_std").advantages
        assert bool((advantages == 0).all()), name


@settings(max_examples=15, deadline=None)
@given(seed=group_seeds)
def test_batch_std_is_scale_none_over_one_divisor_for_the_whole_batch(seed):
    """One divisor for every group: the batch gradient keeps its direction."""
    groups = policy_groups(seed)
    assume(not reference.weights_near_thresholds(groups))  # as in the permutation and scale test
    batch, _ = batch_of(groups)
    divisor = reference.batch_scale(groups, std_floor=0.0, eps=1e-6)  # the pooled std, by hand
    for name in ("tree_rloo", "tree_otb"):
        plain = lp.estimate(batch, name, scale="none").advantages
        scaled = lp.estimate(batch, name, scale="batch_std").advantages
        expected = plain / divisor if math.isfinite(divisor) else torch.zeros_like(plain)
        # tree_otb's learnt weight passes on the rounding of other float32 sums (see the
        # permutation and scale test): LEARNT_TOLERANCE there, on advantages of size ~1
        atol = LEARNT_TOLERANCE if name == "tree_otb" else 1e-5
        assert torch.allclose(scaled, expected, atol=atol, rtol=1e-4), name


@settings(max_examples=15, deadline=None)
@given(seed=group_seeds)
def test_permutation_shift_and_scale(seed):
    """Permuting responses permutes the advantages and scaling the rewards scales them.
    Shifting them leaves the tree's advantages unchanged; OTB's part (in tree_otb's
    mixture) has, as verl's, no baseline where fewer than two responses run or none
    has weight, so there the shift stays in its advantage: it is checked on the tree
    alone and, for the mixture, on groups of policies with no such place."""
    groups = policy_groups(seed)
    # near one of the learnt weight's thresholds its fit is mostly float32 rounding and may
    # move further under another order or scale (docs/estimators.md, "a known limit")
    assume(not reference.weights_near_thresholds(groups))
    batch, _ = batch_of(groups)
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(seed))
    for name, params in (("tree_rloo", {}), ("tree_otb", {}), ("tree_otb", {"tree_weight": 1.0})):
        # the learnt weight is a ratio of float32 sums taken in another order (permuted) or of
        # other roundings (scaled): it passes their rounding on, up to 4.5e-4 of itself in 1000
        # random batches of this kind, which moved advantages by up to 5.3e-5 (before the 2.5
        # scale); LEARNT_TOLERANCE, as in the reference test, leaves a margin of about 20
        learnt = name == "tree_otb" and not params
        base = lp.estimate(batch, name, scale="none", **params).advantages
        permuted = lp.estimate(batch.select(order), name, scale="none", **params).advantages
        assert torch.allclose(permuted, base[order], atol=LEARNT_TOLERANCE if learnt else 1e-5)
        scaled = lp.estimate(batch.with_rewards(batch.rewards * 2.5), name, scale="none", **params).advantages
        assert torch.allclose(scaled, 2.5 * base, atol=2.5 * LEARNT_TOLERANCE if learnt else 5e-5)
        if params or name == "tree_rloo":
            shifted = lp.estimate(batch.with_rewards(batch.rewards + 3.0), name, scale="none", **params).advantages
            assert torch.allclose(shifted, base, atol=5e-5)


@settings(max_examples=15, deadline=None)
@given(seed=group_seeds)
def test_the_mixture_is_shift_invariant_where_otb_has_a_baseline(seed):
    """Equal lengths and no deterministic token (every W > 0, two or more running
    everywhere): shifting all rewards leaves tree_otb's advantages as they were."""
    rng = random.Random(seed)
    groups = []
    for group in policy_groups(seed, max_groups=6):
        length = max(len(r.tokens) for r in group)
        rows = []
        for r in group:
            tokens = (r.tokens + [rng.randrange(3) for _ in range(length)])[:length]
            pis = [rng.uniform(0.05, 0.9) for _ in tokens]
            rows.append(reference.Response(tokens, r.reward, [1.0] * length, _float32([math.log(p) for p in pis]),
                                           _float32([p * p + (1 - p) ** 2 / 2 for p in pis])))
        groups.append(rows if len(rows) > 1 else rows * 2)
    batch, _ = batch_of(groups)
    base = lp.estimate(batch, "tree_otb", scale="none").advantages
    shifted = lp.estimate(batch.with_rewards(batch.rewards + 3.0), "tree_otb", scale="none").advantages
    # the learnt weight is fitted on float32 rewards, whose shift by 3 rounds them by up to
    # 2.4e-7; the fit amplifies that (the learnt-weights test says why): measured 1.7e-4 on
    # a group of 2 responses (hypothesis seed 2827)
    assert torch.allclose(shifted, base, atol=LEARNT_TOLERANCE)


@settings(max_examples=10, deadline=None)
@given(seed=group_seeds)
def test_tree_rloo_groups_never_leak(seed):
    groups = policy_groups(seed, max_groups=3)
    batch, where = batch_of(groups)
    together = lp.estimate(batch, "tree_rloo").advantages
    for g, group in enumerate(groups):
        alone, alone_where = batch_of([group])
        own = lp.estimate(alone, "tree_rloo").advantages
        for i in range(len(group)):
            width = own.shape[1]
            assert torch.equal(together[where[(g, i)], :width], own[alone_where[(0, i)]])


@pytest.mark.parametrize("missing", ["logprobs", "sum_pi_squared"])
def test_tree_otb_names_a_missing_policy_field(missing):
    fields = {"logprobs": [[-0.1]], "sum_pi_squared": [[0.9]]}
    del fields[missing]
    batch = lp.RolloutBatch.from_lists([[1]], [1.0], [0], surprisal=[[1.0]], **fields)
    with pytest.raises(ConfigError, match=f"the batch has no {missing}: pass it as RolloutBatch.from_lists"):
        lp.estimate(batch, "tree_otb")


def test_parameters_are_validated_with_suggestions():
    with pytest.raises(ConfigError, match=r"shrink must be a number or 'auto', got 'automatic'\. Did you mean 'auto'\?"):
        lp.Engine("tree_rloo", {"shrink": "automatic"})
    with pytest.raises(ConfigError, match="shrink must be a finite number >= 0"):
        lp.Engine("tree_rloo", {"shrink": -1.0})
    with pytest.raises(ConfigError, match="Did you mean 'group_std'"):
        lp.Engine("tree_rloo", {"scale": "group_sd"})
    with pytest.raises(ConfigError, match="own_share must be true or false"):
        lp.Engine("tree_otb", {"own_share": "yes"})
    with pytest.raises(ConfigError, match="has no parameter 'own_share'"):
        lp.Engine("tree_rloo", {"own_share": True})
    assert lp.Engine("tree_otb").params.scale == "batch_std" and lp.Engine("tree_rloo").params.scale == "group_std"
    assert lp.Engine("tree_otb", {"scale": "group_std"}).params.scale == "group_std"


BIAS_TASK = Regime(name="small", horizon=8, vocab=3, decisions=(2, 5), group_size=6, peak_logit=3.0,
                   reference_length=6, reward="graded", variants=2)


def in_batches(batch: lp.RolloutBatch, name: str, params: dict, groups: int, size: int) -> torch.Tensor:
    """The estimator's advantages on batches of ``groups`` consecutive groups of ``size``
    responses (as a training step sees them: tree_otb's weights learnt per batch)."""
    step = groups * size
    return torch.cat([lp.estimate(batch.select(torch.arange(start, min(start + step, batch.size))), name, **params)
                      .advantages for start in range(0, batch.size, step)])


def test_unbiased_baselines_average_to_the_exact_gradient_and_leaf_does_not():
    """Statistical bias test on the exact task: over 6,000 groups the mean gradient of
    tree_rloo (no scale) and of tree_otb without its own share with the tree alone
    (per batch of 8 groups) projects on ∇J with coefficient 1 within its 95% CI and has no
    direction bias beyond noise (excess near 1). tree_otb's learnt weight reads the
    batch's own rewards: its mean gradient has no direction bias either, and its
    projection lies within 5% of 1 (0.994 ± 0.012 measured here, per batch of 8 groups).
    LEAF's span credit has a direction bias (the documented fact)."""
    env = Environment.build(BIAS_TASK, 3)
    groups = sample_groups(env, 6000, torch.Generator().manual_seed(0))
    for name, params in (("tree_rloo", {"scale": "none"}), ("tree_otb", {"own_share": False, "scale": "none"}),
                         ("tree_otb", {"own_share": False, "scale": "none", "tree_weight": 1.0})):
        advantages = in_batches(groups.batch, name, params, 8, BIAS_TASK.group_size)
        bias = gradient_bias(env, groups, advantages, blocks=40)
        if name == "tree_otb" and "tree_weight" not in params:  # the learnt weight
            # it reads the call's own rewards, a small bias by design (0.994 ± 0.012 measured
            # here): 5% bounds it with room and still fails a weight that follows the rewards
            assert abs(bias.projection.mean - 1) < 0.05, (name, params, bias)
        else:
            assert abs(bias.projection.mean - 1) < bias.projection.half_width * 1.5, (name, params, bias)
        assert bias.excess < 2.0, (name, params, bias)
    leaf = gradient_bias(env, groups, lp.estimate(groups.batch, "leaf").advantages, blocks=40)
    assert leaf.excess > 3.0, leaf


# derandomized: in about 1 random batch in 100 of this kind (tokens' π and Σπ² drawn per token,
# not per state, so the scores' kernel is not positive semi-definite) a threshold decision of
# the rule falls within float32 rounding and the weight jumps; ``weights_near_thresholds``
# catches some of these, not all (a known limit, docs/estimators.md), so the examples are fixed
@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=group_seeds)
def test_learnt_tree_weights_match_the_reference(seed):
    """Batches of 1 to 8 groups: the weight is fitted on every response of the batch
    (strictly between 0 and 1 in a good share of them)."""
    groups = policy_groups(seed, max_groups=8)
    # a threshold of the rule (a group's share of the largest Z, a kind's D/Z) within rounding
    # of the data may be decided otherwise in float32 than in the float64 reference, and the
    # weight then jumps: such batches (about 1 in 100 here) say nothing about the arithmetic
    assume(not reference.weights_near_thresholds(groups))
    batch, where = batch_of(groups, shuffle_seed=seed)
    for params in ({}, {"own_share": False, "prefix_mean": False}, {"scale": "none", "shrink": "auto"}):
        expected = reference.tree_otb(groups, **params)
        # the learnt weight is a least-squares fit less its standard error, from the other
        # groups' float32 advantages (rounding ~6e-8 of the rewards' scale): where a fit's
        # residuals are small the rounding is amplified. Over 300 random batches of this kind
        # the largest difference from the float64 reference was 5.4e-5 (advantages of size
        # <= ~2), and 4.9e-4 in one of the fixed examples here (a weight fitted from kinds whose
        # statistics are ~1e-6 of the others'); 1e-3 leaves a margin of 2
        assert_rows(lp.estimate(batch, "tree_otb", **params).advantages, where, expected, f"tree_otb {params}",
                    atol=LEARNT_TOLERANCE)


def test_learnt_weights_are_exercised():
    """The reference comparison above is not vacuous: across its kind of batches, learnt
    weights strictly between 0 and 1 occur."""
    inside = 0
    for seed in range(24):
        groups = policy_groups(seed, max_groups=8)
        tree, base = reference.tree_part(groups), reference.otb_part(groups)
        move = [[[a - b for a, b in zip(t, o)] for t, o in zip(tg, og)] for tg, og in zip(tree, base)]
        inside += 0 < reference.tree_weight_of(groups, base, move) < 1
    assert inside >= 8  # 17 of these 24 batches


def test_tree_weight_mixes_the_two_advantages():
    """``tree_weight`` λ gives OTB's advantage plus λ times the step to the tree's: 0 is
    OTB's (with the class-mean reward, divided by the same scale), 1 the tree's, and 0.25
    a quarter of the way; ``auto`` is one λ in [0, 1] for the whole batch, a group alone
    included (it fits on its own responses)."""
    groups = policy_groups(7)
    alone = policy_groups(0)[1]  # a group whose own fit is strictly inside (0, 1): 0.898
    for chosen in (groups, [alone]):
        batch, _ = batch_of(chosen)
        tree = lp.estimate(batch, "tree_otb", tree_weight=1.0).advantages
        otb = lp.estimate(batch, "tree_otb", tree_weight=0.0).advantages
        quarter = lp.estimate(batch, "tree_otb", tree_weight=0.25).advantages
        # the same float32 mix computed twice, of advantages of size <= ~2 (ulp 2.4e-7): 1e-6
        assert torch.allclose(quarter, otb + 0.25 * (tree - otb), atol=1e-6)
        learnt = lp.estimate(batch, "tree_otb").advantages
        step = tree - otb
        weight = float((learnt - otb).mul(step).sum() / step.square().sum())  # the λ that auto used
        assert 0 <= weight <= 1
        assert torch.allclose(learnt, otb + weight * step, atol=1e-6)  # as above: one λ for every token
    assert 0 < weight < 1, "a group alone learns its weight: it needs no other group"


def test_tree_weight_zero_is_otb_over_the_batch_scale():
    """Without prefix means and at ``scale: none``, weight 0 is verl's OTB itself (its
    path weights in float32 without cancellation: equal to 1e-5 here, where no token is
    near-deterministic), and a group of one gets 0 where OTB leaves it its reward."""
    rng = random.Random(3)
    tokens = [[rng.randrange(3) for _ in range(rng.randint(1, 6))] for _ in range(9)]
    pis = [[rng.uniform(0.2, 0.9) for _ in row] for row in tokens]
    batch = lp.RolloutBatch.from_lists(tokens, [rng.random() for _ in tokens], [0, 0, 0, 0, 1, 1, 1, 1, 2],
                                       surprisal=[[1.0] * len(row) for row in tokens], logprobs=[[math.log(p) for p in row] for row in pis],
                                       sum_pi_squared=[[p * p + (1 - p) ** 2 / 2 for p in row] for row in pis])
    got = lp.estimate(batch, "tree_otb", tree_weight=0.0, prefix_mean=False, scale="none").advantages
    otb = lp.estimate(batch, "otb").advantages
    assert torch.allclose(got[:8], otb[:8], atol=1e-5)
    assert bool((got[8] == 0).all()) and bool((otb[8, :1] != 0).all())


def test_kernel_terms_by_hand():
    """One group, three responses; the first token in one state: tokens a, a, b with
    π_a = .5, π_b = .3 and Σπ² = .38, so the scores' inner products are
    K_aa = 1 − 2(.5) + .38 = .38, K_bb = .78, K_ab = −.5 − .3 + .38 = −.42. With
    e = (1, 2, 3) and d = (1, 0, −1): class {0, 1} (E = 3, D = 1) gives
    K_aa (D E, D D, E E) = (1.14, .38, 3.42), class {2} (E = 3, D = −1) K_bb (−3, 1, 9) =
    (−2.34, .78, 7.02), and the pairs (0, 2), (1, 2), (2, 0), (2, 1) K_ab (d_j e_l, d_j d_l,
    e_j e_l) = (−1.26, .42, −1.26), (0, 0, −2.52), (.42, .42, −1.26), (.84, 0, −2.52): in all
    (−1.2, 2, 2.88), |3 s_a + 3 s_b|² = 9 K_aa + 18 K_ab + 9 K_bb for the last. A second
    token after the two a's (c and d, one state of its own, π = .5 each, Σπ² = .5):
    K_cc = .5, K_cd = −.5; e = (1, 1), d = (2, 0): classes (2 · .5, 4 · .5, .5) and (0, 0, .5),
    pairs (0, 1) −.5 (2, 0, 1) and (1, 0) −.5 (0, 0, 1): in all (0, 2, 0). The diagonal: each
    token with itself."""
    batch = lp.RolloutBatch.from_lists([[0, 2], [0, 3], [1]], [0.0, 0.0, 0.0], [0, 0, 0],
                                       logprobs=[[math.log(0.5)] * 2, [math.log(0.5)] * 2, [math.log(0.3)]],
                                       sum_pi_squared=[[0.38, 0.5], [0.38, 0.5], [0.38]])
    prefixes = SortedPrefixes.lexicographic(batch)
    shared, partners = shared_prefix_lengths(batch, prefixes)
    base = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 0.0]])
    move = torch.tensor([[1.0, 2.0], [0.0, 0.0], [-1.0, 0.0]])
    u = -torch.expm1(batch.logprobs) * batch.mask  # 1 − π
    v = (1 - batch.sum_pi_squared) * batch.mask
    terms = kernel_terms(batch, prefixes, shared, partners, base, move, (2 * u - v).clamp(min=0), v)
    # float32 products of a few numbers of size <= 10: rounded to 5 decimals, far above their ulps
    classes = sorted(tuple(round(x, 5) for x in unit) for unit in terms.classes.reshape(3, -1).T.tolist() if any(unit))
    assert classes == sorted([(1.14, 0.38, 3.42), (-2.34, 0.78, 7.02), (1.0, 2.0, 0.5), (0.0, 0.0, 0.5)])
    pairs = sorted(tuple(round(x, 5) for x in unit) for unit in terms.pairs.reshape(3, -1).T.tolist() if any(unit))
    assert pairs == sorted([(-1.26, 0.42, -1.26), (0.0, 0.0, -2.52), (0.42, 0.42, -1.26), (0.84, 0.0, -2.52),
                            (-1.0, 0.0, -0.5), (0.0, 0.0, -0.5)])
    totals = terms.classes.sum(dim=(1, 2, 3)) + terms.pairs.sum(dim=(1, 2))  # float32 sums of ~10 such terms
    assert totals.tolist() == pytest.approx([-1.2, 4.0, 2.88], abs=1e-5)
    # each token with itself, w (d e, d d): K_aa = .38, K_bb = .78 and K_cc = .5 (float32
    # products of two or three numbers of size <= 3: within a few ulps, 1e-6), in the
    # sorted layout, here the batch's order
    assert prefixes.order.tolist() == [0, 1, 2]
    assert terms.diagonal.flatten(1, 2).permute(1, 2, 0).tolist() == [
        [pytest.approx([0.38] * 2, abs=1e-6), pytest.approx([1.0, 2.0], abs=1e-6)],
        [pytest.approx([0.0, 0.0], abs=1e-6), pytest.approx([0.0, 0.0], abs=1e-6)],
        [pytest.approx([-2.34, 0.78], abs=1e-6), pytest.approx([0.0] * 2, abs=1e-6)]]


def test_pooled_weight_by_hand():
    """Two groups of two responses, one position, one class unit and one diagonal unit
    each, no pairs. Group 0: class (n, d, e) = (−2, 4, 2) (so Z = 2), diagonal
    (−1.5, 2.5, 1.5): its variance coefficients (K diag − Q) / (K − 1) = (−1, 1), over Z
    (−.5, .5). Group 1: class (−1, 2, 1) (Z = 1), diagonal (−1, 2, .5): (−1, 2). The fit
    λ̂ = 1.5 / 2.5 = .6; the units' residuals n + λ̂ d times their coefficients
    (a class −1/((K − 1) Z), a diagonal K/((K − 1) Z)): group 0 .4 · −.5 and 0 · 1, group 1
    .2 · −1 and .2 · 2, standard error √.24 / 2.5: λ = .40404. Group 0 alone (group 1's
    rewards all equal) fits λ̂ = 1 with an error of 2√2: 0. Group 1 alone (group 0's Z
    scaled under 1e-4 of the largest) fits .5 with no residual; with no move, 0."""
    def terms(groups: list[tuple[list[float], list[float]]]) -> KernelTerms:  # (class unit, diagonal unit) each
        classes = torch.zeros(3, len(groups), 2, 1)
        diagonal = torch.zeros(2, len(groups), 2, 1)
        for g, (unit, own) in enumerate(groups):
            classes[:, g, 0, 0] = torch.tensor(unit)
            diagonal[:, g, 0, 0] = torch.tensor(own[:2])
        return KernelTerms(classes, torch.zeros(3, 2 * len(groups), 2), diagonal)

    layout = lp.RolloutBatch.from_lists([[1]] * 4, [0.0, 1.0, 0.0, 1.0], [0, 0, 1, 1]).groups
    units = [([-2.0, 4.0, 2.0], [-1.5, 2.5, 1.5]), ([-1.0, 2.0, 1.0], [-1.0, 2.0, 0.5])]
    both = torch.tensor([True, True])
    # float32 units of size <= 4: the weight to a few ulps
    assert pooled_weight(terms(units), layout, both).item() == pytest.approx(0.6 - 0.24 ** 0.5 / 2.5, abs=1e-6)
    assert pooled_weight(terms(units), layout, torch.tensor([True, False])).item() == 0.0
    tiny = [tuple([x * 1e-5 for x in unit] for unit in units[0]), units[1]]  # Z_0 = 2e-5, under 1e-4 of Z_1 = 1
    assert pooled_weight(terms(tiny), layout, both).item() == pytest.approx(0.5, abs=1e-6)
    still = [([0.0, 0.0, unit[2]], [0.0, 0.0, own[2]]) for unit, own in units]
    assert pooled_weight(terms(still), layout, both).item() == 0.0
