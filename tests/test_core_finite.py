"""No NaN or infinity gets into a RolloutBatch or out of estimate()."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leaf_plugins as lp
from estimator_cases import PARAMETER_GRID, group_seeds, random_groups, to_batch
from leaf_plugins.core.errors import NonFiniteError
from leaf_plugins.core.finite import nonfinite_fields

ESTIMATORS = ["grpo", "leaf", "collision", "full_tree"]
BAD = [math.nan, math.inf, -math.inf]


def small_batch(**fields) -> lp.RolloutBatch:
    """Two groups (ids 7 and 9) of two responses: response 2 is [5, 6, 7]."""
    values = {"rewards": [0.0, 1.0, 0.5, 0.25],
              "surprisal": [[0.1, 0.2], [0.1, 0.3], [0.5, 0.6, 0.7], [0.5]],
              "logprobs": [[-0.1, -0.2], [-0.1, -0.3], [-0.5, -0.6, -0.7], [-0.5]],
              "sum_pi_squared": [[0.5, 0.4], [0.5, 0.4], [0.3, 0.2, 0.1], [0.3]]}
    values.update(fields)
    return lp.RolloutBatch.from_lists([[1, 2], [1, 3], [5, 6, 7], [5]], group_ids=[7, 7, 9, 9], **values)


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
def test_a_non_finite_reward_is_named_with_its_response_and_group(bad):
    with pytest.raises(NonFiniteError, match=rf"rewards of response 2 \(group id 9\) is {bad}"):
        small_batch(rewards=[0.0, 1.0, bad, 0.25])


@pytest.mark.parametrize("name", ["surprisal", "logprobs", "sum_pi_squared"])
@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
def test_a_non_finite_per_token_value_is_named_with_its_field_response_group_and_token(name, bad):
    rows = [[0.1, 0.2], [0.1, 0.3], [0.5, 0.6, 0.7], [0.5]]
    rows[2] = [0.5, bad, 0.7]
    with pytest.raises(NonFiniteError, match=rf"^RolloutBatch: {name} of response 2 \(group id 9, token 1\) is {bad}$"):
        small_batch(**{name: rows})


def test_every_bad_field_is_reported_with_the_count_of_bad_values():
    with pytest.raises(NonFiniteError) as error:
        small_batch(rewards=[math.nan, math.nan, 0.0, math.inf],
                    logprobs=[[-0.1, -0.2], [-0.1, -0.3], [0, 0, 0], [math.nan]])
    assert str(error.value) == ("RolloutBatch: rewards of response 0 (group id 7) is nan (2 more non-finite values); "
                                "logprobs of response 3 (group id 9, token 0) is nan")


def test_batches_derived_from_a_batch_are_checked_too():
    batch = small_batch()
    with pytest.raises(NonFiniteError, match=r"rewards of response 1 \(group id 7\) is inf"):
        batch.with_rewards(torch.tensor([0.0, math.inf, 0.0, 0.0]))
    assert torch.equal(batch.select(torch.tensor([2, 3])).rewards, torch.tensor([0.5, 0.25]))


def test_the_check_reduces_each_field_once_and_looks_closer_only_at_suspects(monkeypatch):
    """Finite fields: one sum each and one isfinite over the [F] sums; a field whose sum
    overflowed (huge finite values) gets the exact check and passes; a NaN is found."""
    checked = []
    original = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda value: checked.append(tuple(value.shape)) or original(value))
    fields = {"a": torch.zeros(3), "b": None, "c": torch.ones(3, 4), "d": torch.zeros(0)}
    assert nonfinite_fields(fields) == []
    assert checked == [(2,)]  # the sums of a and c (None and empty d skipped)
    checked.clear()
    huge = torch.full((2, 3), 3e38)  # finite, but its sum overflows
    assert nonfinite_fields({"a": torch.zeros(3), "huge": huge}) == []
    assert checked == [(2,), (2, 3)]
    assert nonfinite_fields({"a": torch.tensor([0.0, math.nan]), "b": torch.ones(2),
                             "c": torch.tensor([math.inf, -math.inf])}) == ["a", "c"]


finite_floats = st.floats(allow_nan=False, allow_infinity=False, width=32)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@settings(max_examples=30, deadline=None)
@given(seed=group_seeds, rewards=st.lists(finite_floats, min_size=1, max_size=40),
       surprisal=st.lists(finite_floats, min_size=1, max_size=40), choice=st.integers(0, 10**6))
def test_no_finite_batch_makes_estimate_return_a_non_finite_advantage(estimator, seed, rewards, surprisal, choice):
    """Any finite float32 rewards and surprisal (0, subnormals, ±3.4e38 included): the
    advantages are finite, or estimate() raises NonFiniteError naming the estimator."""
    groups = random_groups(seed)
    rng = random.Random(seed)
    for group in groups:
        for response in group:
            response.reward = rng.choice(rewards)
            response.surprisal = [rng.choice(surprisal) for _ in response.tokens]
    batch, _ = to_batch(groups)
    params = PARAMETER_GRID[estimator][choice % len(PARAMETER_GRID[estimator])]
    try:
        advantages = lp.estimate(batch, estimator, **params).advantages
    except NonFiniteError as error:
        assert str(error).startswith(f"estimator {estimator!r}: advantages of response ")
        return
    assert bool(torch.isfinite(advantages).all())


def test_an_estimator_that_overflows_is_stopped_at_the_engine():
    class Overflowing:
        parameters = lp.NoParameters

        @lp.hookimpl
        def select_boundaries(self, batch, params):
            return lp.Boundaries.empty(batch.groups.count, batch.device)

        @lp.hookimpl
        def retain_nodes(self, batch, boundaries, params):
            return lp.estimate(batch, "grpo").nodes

        @lp.hookimpl
        def compute_advantages(self, batch, nodes, params):
            return batch.rewards[:, None].expand(-1, batch.width) * 1e30 * 1e30

    class Register:
        @lp.hookimpl
        def register_estimators(self, register):
            register("overflowing", Overflowing())

    host = lp.core.plugins.PluginHost.discover(extra_plugins=[("overflowing", Register())], strict=True)
    engine = lp.Engine("overflowing", host=host)
    with pytest.raises(NonFiniteError, match=r"estimator 'overflowing': advantages of response 1 "
                                             r"\(group id 7, token 0\) "
                                             r"is inf .* rescale the rewards"):
        engine.estimate(small_batch())
