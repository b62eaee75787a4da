"""``otb`` (verl's optimal token baseline): the worked example of docs/estimators.md, every
corner by hand, the slow reference on random ragged batches, invariants and input errors."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leaf_plugins as lp
from leaf_plugins.core.errors import NonFiniteError
from estimator_cases import group_seeds, random_groups
from reference_otb import PolicyResponse, otb, otb_groups, path_weights

FAST = settings(max_examples=40, deadline=None)


def policy_groups(seed: int, **shape) -> list[list[PolicyResponse]]:
    """``random_groups`` with a policy behind every token: the sampled token's π and Σπ²
    of a random distribution over 2–5 tokens, or a deterministic token (π = Σπ² = 1,
    weight 0), and now and then a response whose tokens are all deterministic."""
    rng = random.Random(seed)
    groups = []
    for group in random_groups(seed, **shape):
        policy_group = []
        for response in group:
            always_sure = rng.random() < 0.1
            logprobs, squares = [], []
            for _ in response.tokens:
                if always_sure or rng.random() < 0.2:
                    logprobs.append(0.0)
                    squares.append(1.0)
                    continue
                masses = [rng.random() + 0.05 for _ in range(rng.randint(2, 5))]
                probabilities = [m / sum(masses) for m in masses]
                logprobs.append(math.log(rng.choice(probabilities)))
                squares.append(sum(p * p for p in probabilities))
            policy_group.append(PolicyResponse(response.tokens, response.reward, logprobs, squares))
        groups.append(policy_group)
    return groups


def to_batch(groups: list[list[PolicyResponse]], shuffle_seed: int | None = None):
    """The groups as one RolloutBatch (optionally interleaved) and the row of every
    (group, response) pair."""
    rows = [(g, i) for g, group in enumerate(groups) for i in range(len(group))]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    batch = lp.RolloutBatch.from_lists(
        [groups[g][i].tokens for g, i in rows],
        [groups[g][i].reward for g, i in rows],
        [g for g, _ in rows],
        logprobs=[groups[g][i].logprobs for g, i in rows],
        sum_pi_squared=[groups[g][i].sum_pi_squared for g, i in rows],
    )
    return batch, {pair: row for row, pair in enumerate(rows)}


def assert_matches_reference(groups: list[list[PolicyResponse]], shuffle_seed: int | None = None) -> None:
    batch, where = to_batch(groups, shuffle_seed)
    advantages = lp.estimate(batch, "otb").advantages
    assert advantages.dtype == torch.float32 and advantages.shape == batch.tokens.shape
    assert bool((advantages[~batch.mask] == 0).all()), "padding must be exactly 0"
    for g, expected in enumerate(otb_groups(groups)):
        for i, row in enumerate(expected):
            got = advantages[where[(g, i)], : len(row)].double()
            assert torch.allclose(got, torch.tensor(row, dtype=torch.float64), atol=2e-5, rtol=1e-4), (
                f"group {g} response {i}: expected {row}, got {got.tolist()}"
            )


def one_group(*responses: tuple[float, list[float], list[float]]) -> lp.RolloutBatch:
    """A batch of one group from ``(reward, π per token, Σπ² per token)``."""
    return lp.RolloutBatch.from_lists(
        [list(range(len(pi))) for _, pi, _ in responses],
        [reward for reward, _, _ in responses],
        [0] * len(responses),
        logprobs=[[math.log(p) for p in pi] for _, pi, _ in responses],
        sum_pi_squared=[squares for _, _, squares in responses],
    )


def assert_rows(advantages: torch.Tensor, rows: list[list[float]], atol: float = 1e-7) -> None:
    expected = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(advantages.double(), expected, atol=atol), f"expected {rows}, got {advantages.tolist()}"


# ------------------------------------------------------------------ worked examples
def test_worked_example_from_the_docs():
    batch = one_group(
        (1.0, [0.5, 0.9], [0.5, 0.82]),  # w = 0.5, 0.02      W = 0.5, 0.52
        (0.2, [0.25, 0.5, 1.0], [0.25, 0.5, 1.0]),  # w = 0.75, 0.5, 0   W = 0.75, 1.25, 1.25
        (0.0, [1.0], [1.0]),  # w = 0  W = 0: its reward gets no weight
    )
    b0 = (0.5 * 1.0 + 0.75 * 0.2 + 0.0) / (1.25 + 1e-8)  # 0.52
    b1 = (0.52 * 1.0 + 1.25 * 0.2) / (1.77 + 1e-8)  # 0.435028
    expected = torch.tensor([[1 - b0, 1 - b1, 0.0], [0.2 - b0, 0.2 - b1, 0.2], [0.0 - b0, 0.0, 0.0]])
    advantages = lp.estimate(batch, "otb").advantages
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert_rows(advantages, [[0.48, 0.564972, 0.0], [-0.32, -0.235028, 0.2], [-0.52, 0.0, 0.0]], atol=1e-6)


def test_a_group_of_one_keeps_its_reward_as_in_verl():
    batch = one_group((0.7, [0.5, 0.5, 0.9], [0.5, 0.5, 0.82]))
    assert_rows(lp.estimate(batch, "otb").advantages, [[0.7] * 3])


def test_an_all_equal_group_gets_no_advantage_where_two_run_and_its_reward_in_a_unique_tail():
    batch = one_group((0.5, [0.5, 0.5], [0.5, 0.5]), (0.5, [0.25, 0.5, 0.5, 0.5], [0.25, 0.5, 0.5, 0.5]))
    advantages = lp.estimate(batch, "otb").advantages
    assert advantages[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0], abs=1e-7)
    assert advantages[1].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5], abs=1e-7)


def test_tied_longest_responses_keep_their_baseline_to_the_end():
    batch = one_group((1.0, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]), (0.0, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
                      (0.5, [0.5], [0.5]))
    advantages = lp.estimate(batch, "otb").advantages
    # equal weights: plain means of the running rewards, 0.5 at t = 0 and at t = 1, 2
    assert_rows(advantages, [[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0]], atol=1e-7)


def test_weights_are_cumulative_so_a_late_uncertain_token_counts_from_then_on():
    # response 0 is certain at t = 0 (weight 0) and uncertain at t = 1; response 1 the reverse
    batch = one_group((1.0, [1.0, 0.5], [1.0, 0.5]), (0.0, [0.5, 1.0], [0.5, 1.0]))
    advantages = lp.estimate(batch, "otb").advantages
    b0 = 0.0  # only response 1 has weight: W = (0, 0.5)
    b1 = (0.5 * 1.0 + 0.5 * 0.0) / (1.0 + 1e-8)  # W = (0.5, 0.5)
    assert_rows(advantages, [[1 - b0, 1 - b1], [0 - b0, 0 - b1]], atol=1e-7)


def test_zero_weight_everywhere_gives_baseline_zero():
    """Every running response certain so far: Σ W = 0, the baseline is 0/ε = 0 (verl)."""
    batch = one_group((1.0, [1.0, 0.5], [1.0, 0.5]), (0.0, [1.0, 0.5], [1.0, 0.5]))
    advantages = lp.estimate(batch, "otb").advantages
    assert advantages[:, 0].tolist() == [1.0, 0.0]
    assert advantages[:, 1].tolist() == pytest.approx([0.5, -0.5])


def test_rounding_below_zero_weight_is_clamped_not_amplified():
    """π a hair below 1 and Σπ² rounded a hair below π²: the float32 weight is about
    -1e-7; unclamped, Σ W + ε would be about -1e-7 and the baseline about -5 rewards."""
    near_one = math.exp(-1e-9)
    batch = lp.RolloutBatch.from_lists(
        [[1], [1]], [1.0, 0.0], [0, 0], logprobs=[[math.log(near_one)], [math.log(near_one)]],
        sum_pi_squared=[[1 - 1e-7], [1 - 1e-7]],
    )
    assert_rows(lp.estimate(batch, "otb").advantages, [[1.0], [0.0]])


def test_length_one_and_empty_responses():
    batch = one_group((1.0, [0.5], [0.5]), (0.0, [0.5], [0.5]), (0.5, [], []))
    advantages = lp.estimate(batch, "otb").advantages
    assert_rows(advantages, [[0.5], [-0.5], [0.0]])
    # an empty response still counts as a member: the other one is the unique longest
    lone = one_group((1.0, [0.5, 0.5], [0.5, 0.5]), (0.0, [], []))
    assert_rows(lp.estimate(lone, "otb").advantages, [[1.0, 1.0], [0.0, 0.0]])


def test_no_responses_at_all():
    batch = lp.RolloutBatch.from_lists([], [], [], logprobs=[], sum_pi_squared=[])
    assert lp.estimate(batch, "otb").advantages.shape == (0, 0)


def test_reference_weights_follow_the_docs():
    response = PolicyResponse([1, 2, 3], 1.0, [math.log(0.5), 0.0, math.log(0.9)], [0.5, 1.0, 0.82])
    assert path_weights(response) == pytest.approx([0.5, 0.5, 0.52])
    assert otb([response]) == [[1.0, 1.0, 1.0]]


# ------------------------------------------------------------------ against the reference
@FAST
@given(seed=group_seeds, shuffle=st.booleans())
def test_matches_the_reference(seed, shuffle):
    assert_matches_reference(policy_groups(seed), shuffle_seed=seed if shuffle else None)


@FAST
@given(seed=group_seeds)
def test_matches_the_reference_on_uniform_groups(seed):
    """Equal-size contiguous groups: the layout the trainer produces (views of [G, K, T])."""
    groups = policy_groups(seed, max_k=5)
    size = min(len(group) for group in groups)
    groups = [group[:size] for group in groups]
    assert to_batch(groups)[0].groups.uniform_size == size
    assert_matches_reference(groups)


def test_matches_the_reference_on_long_responses():
    """Rows of a few hundred tokens: the float32 running sums stay within tolerance."""
    assert_matches_reference(policy_groups(7, max_groups=3, max_k=8, max_len=400, vocab=50), shuffle_seed=7)


# ------------------------------------------------------------------ invariants
@FAST
@given(seed=group_seeds)
def test_permuting_the_responses_permutes_the_output(seed):
    groups = policy_groups(seed)
    batch, where = to_batch(groups)
    permuted, where_permuted = to_batch(groups, shuffle_seed=seed + 1)
    a = lp.estimate(batch, "otb").advantages
    b = lp.estimate(permuted, "otb").advantages
    for pair, row in where.items():
        assert torch.allclose(a[row], b[where_permuted[pair]], atol=1e-6)


@FAST
@given(seed=group_seeds)
def test_groups_never_leak_into_each_other(seed):
    groups = policy_groups(seed)
    together, where = to_batch(groups, shuffle_seed=seed)
    combined = lp.estimate(together, "otb").advantages
    for g, group in enumerate(groups):
        single = lp.estimate(to_batch([group])[0], "otb").advantages
        for i, response in enumerate(group):
            width = len(response.tokens)
            assert torch.allclose(combined[where[(g, i)], :width], single[i, :width], atol=1e-6)


@FAST
@given(seed=group_seeds, scale=st.floats(0.1, 10))
def test_advantages_scale_with_the_rewards(seed, scale):
    batch, _ = to_batch(policy_groups(seed))
    raw = lp.estimate(batch, "otb").advantages
    scaled = lp.estimate(batch.with_rewards(batch.rewards * scale), "otb").advantages
    assert torch.allclose(scaled, raw * scale, atol=1e-5, rtol=1e-4)


@FAST
@given(seed=group_seeds)
def test_the_weighted_advantages_of_the_running_responses_cancel(seed):
    """Σ_i W_{i,t} (r_i - b_t) = ε b_t ≈ 0 over the responses running at t, wherever at
    least two run: the baseline is the W-weighted mean."""
    groups = policy_groups(seed)
    batch, where = to_batch(groups)
    advantages = lp.estimate(batch, "otb").advantages
    for g, group in enumerate(groups):
        lengths = sorted(len(r.tokens) for r in group)
        for t in range(lengths[-2] if len(group) > 1 else 0):
            running = [i for i, r in enumerate(group) if t < len(r.tokens)]
            total = sum(path_weights(group[i])[t] * float(advantages[where[(g, i)], t]) for i in running)
            assert abs(total) < 1e-4 * (1 + sum(path_weights(group[i])[t] for i in running))


def test_advantages_can_weight_a_differentiable_loss():
    batch, _ = to_batch(policy_groups(3))
    advantages = lp.estimate(batch, "otb").advantages
    assert not torch.is_inference(advantages)
    logprobs = torch.zeros(batch.tokens.shape, requires_grad=True)
    (advantages * logprobs).sum().backward()
    assert torch.equal(logprobs.grad, advantages)


def test_stage_overrides_leave_the_credit_unchanged():
    """otb reads neither boundaries nor nodes: any boundary stage gives the same advantages."""
    groups = policy_groups(11)
    batch, _ = to_batch(groups)
    plain = lp.estimate(batch, "otb").advantages
    leaf_cut = lp.RolloutBatch(batch.tokens, batch.lengths, batch.group_ids, batch.rewards,
                               surprisal=-batch.logprobs, logprobs=batch.logprobs, sum_pi_squared=batch.sum_pi_squared)
    mixed = lp.estimate(leaf_cut, "otb", stages={"select_boundaries": "leaf"})
    assert torch.equal(mixed.advantages, plain)


# ------------------------------------------------------------------ input errors
@pytest.mark.parametrize("missing", [("logprobs",), ("sum_pi_squared",), ("logprobs", "sum_pi_squared")])
def test_a_missing_policy_field_is_named_with_how_to_provide_it(missing):
    fields = {"logprobs": [[-0.5, -0.1], [-0.2]], "sum_pi_squared": [[0.6, 0.9], [0.7]]}
    for name in missing:
        fields[name] = None
    batch = lp.RolloutBatch.from_lists([[1, 2], [3]], [1.0, 0.0], [0, 0], **fields)
    with pytest.raises(lp.ConfigError) as error:
        lp.estimate(batch, "otb")
    message = str(error.value)
    assert f"no {' and '.join(missing)}:" in message
    assert "RolloutBatch.from_lists(..., logprobs=..., sum_pi_squared=...)" in message
    assert "trainer" in message


def test_sum_pi_squared_below_the_sampled_tokens_square_is_refused():
    """Σπ² < π² cannot come from one distribution (e.g. logprobs of the policy but Σπ²
    of a sharpened sampling distribution, or the two fields swapped)."""
    batch = lp.RolloutBatch.from_lists([[1, 2], [3]], [1.0, 0.0], [0, 0], logprobs=[[-0.1, math.log(0.9)], [-0.2]],
                                       sum_pi_squared=[[0.9, 0.5], [0.7]])
    with pytest.raises(lp.ConfigError, match=r"response 0, token 1, sum_pi_squared = 0\.5 is below π² = 0\.81"):
        lp.estimate(batch, "otb")


@pytest.mark.parametrize("field, row, position", [("logprobs", 1, 0), ("sum_pi_squared", 0, 1)])
def test_a_non_finite_policy_value_is_named(field, row, position):
    values = {"logprobs": [[-0.5, -0.1], [-0.2]], "sum_pi_squared": [[0.6, 0.9], [0.7]]}
    values[field][row][position] = float("nan")
    with pytest.raises(NonFiniteError, match=rf"{field} of response {row} \(group id 0, token {position}\) is nan"):
        lp.RolloutBatch.from_lists([[1, 2], [3]], [1.0, 0.0], [0, 0], **values)


def test_a_non_finite_reward_is_named():
    with pytest.raises(NonFiniteError, match=r"rewards of response 1 \(group id 0\) is inf"):
        lp.RolloutBatch.from_lists([[1], [2]], [1.0, float("inf")], [0, 0], logprobs=[[-0.5], [-0.5]],
                                   sum_pi_squared=[[0.5], [0.5]])


def test_otb_takes_no_parameters():
    batch, _ = to_batch(policy_groups(1))
    with pytest.raises(lp.ConfigError, match=r"estimator 'otb' has no parameter 'eps'\. Its parameters: \(none\)"):
        lp.estimate(batch, "otb", eps=1e-6)


def test_a_very_large_group_needs_no_pairwise_table():
    """K = 2048 responses of 64 tokens: a K × K × T table would hold 268M floats (1 GiB);
    the estimator's memory is O(K·T) and it matches the reference."""
    rng = random.Random(5)
    group = []
    for _ in range(2048):
        length = rng.randint(1, 64)
        pi = [rng.uniform(0.05, 0.95) for _ in range(length)]
        group.append(PolicyResponse([0] * length, rng.random(), [math.log(p) for p in pi],
                                    [p * p + (1 - p) ** 2 * rng.random() for p in pi]))
    assert_matches_reference([group])


def test_finite_junk_on_padding_is_never_read_and_a_nan_there_is_named():
    batch, _ = to_batch(policy_groups(2))
    clean = lp.estimate(batch, "otb").advantages
    padding = ~batch.mask
    junk = lp.RolloutBatch(batch.tokens, batch.lengths, batch.group_ids, batch.rewards,
                           logprobs=batch.logprobs.masked_fill(padding, -3.0),
                           sum_pi_squared=batch.sum_pi_squared.masked_fill(padding, 7.0))
    assert torch.equal(lp.estimate(junk, "otb").advantages, clean)
    row = int(batch.lengths.argmin())
    logprobs = batch.logprobs.clone()
    logprobs[row, batch.width - 1] = float("nan")
    assert int(batch.lengths[row]) < batch.width  # the NaN sits on padding
    with pytest.raises(NonFiniteError, match=r"logprobs of response \d+ \(group id \d+, token \d+\) is nan"):
        lp.RolloutBatch(batch.tokens, batch.lengths, batch.group_ids, batch.rewards,
                        logprobs=logprobs, sum_pi_squared=batch.sum_pi_squared)
