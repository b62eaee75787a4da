"""Forkability: fire/usable outcomes on hand-built groups, Wilson CI, depth quantiles."""

from __future__ import annotations

import math

import pytest
import torch

from leaf_plugins import RolloutBatch, estimate
from leaf_plugins.analysis.forkability import (
    ForkabilityReport, depth_quantile, fork_events, forkability_from_batches, wilson_interval,
)


def _batch(tokens, rewards, groups, surprisal=None):
    surprisal = surprisal or [[1.0] * len(row) for row in tokens]
    return RolloutBatch.from_lists(tokens, rewards, groups, surprisal=surprisal)


# group 7: three responses share [1, 2], two of them share [1, 2, 3]; group 3: [4, 4] twice
# with equal rewards, one shorter response [4] keyed by its whole sequence
TOKENS = [[1, 2, 3, 4], [9, 9, 9, 9], [1, 2, 3, 5], [1, 2, 6, 7], [4, 4, 4], [4], [4, 4, 5]]
REWARDS = [1.0, 0.5, 0.2, 0.6, 0.3, 0.9, 0.3]
GROUPS = [7, 7, 7, 7, 3, 3, 3]


def test_fire_and_usable_outcomes_by_hand():
    batch = _batch(TOKENS, REWARDS, GROUPS)
    # groups are numbered by ascending id: row 0 is group 3, row 1 group 7
    positions = torch.tensor([[2, 3], [2, 4]])
    events = fork_events(batch, positions, tau=0.0)
    # attempts in (group, slot) order: g3@2, g3@3, g7@2, g7@4
    assert events.position.tolist() == [2, 3, 2, 4]
    # g3@2: {[4,4] x2 (0.3, 0.3)}, {[4]} -> fired, spread 0 -> not usable
    # g3@3: [4,4,4], [4], [4,4,5] all distinct -> not fired
    # g7@2: {[1,2] x3 (1.0, 0.2, 0.6)} -> fired, spread 0.8 -> usable
    # g7@4: all four differ -> not fired
    assert events.fired.tolist() == [True, False, True, False]
    assert events.usable.tolist() == [False, False, True, False]
    assert sorted(zip(events.group_position.tolist(), events.group_size.tolist(),
                      [round(s, 6) for s in events.group_spread.tolist()])) == [(2, 2, 0.0), (2, 3, 0.8)]


def test_tau_and_unused_slots():
    batch = _batch(TOKENS, REWARDS, GROUPS)
    positions = torch.tensor([[2, -1], [3, -1]])  # g7@3: {[1,2,3] x2 (1.0, 0.2)} spread 0.8
    assert fork_events(batch, positions, tau=0.5).usable.tolist() == [False, True]
    assert fork_events(batch, positions, tau=0.8).usable.tolist() == [False, False]  # strictly greater
    assert fork_events(batch, positions, tau=0.0).position.tolist() == [2, 3]  # -1 slots are no attempts


def test_short_responses_are_keyed_by_their_whole_sequence():
    batch = _batch([[5, 6], [5, 6], [5, 6, 7], [5]], [0.0, 1.0, 0.5, 0.5], [0, 0, 0, 0])
    events = fork_events(batch, torch.tensor([[3]]), tau=0.0)
    # at p = 3: [5, 6] twice (whole sequence, equal) -> a group of 2 with spread 1
    assert events.fired.tolist() == [True] and events.usable.tolist() == [True]
    assert events.group_size.tolist() == [2]


def test_matches_a_slow_python_reference_on_random_groups():
    generator = torch.Generator().manual_seed(5)
    tokens, rewards, groups = [], [], []
    for g in range(30):
        for _ in range(int(torch.randint(1, 7, (1,), generator=generator))):
            length = int(torch.randint(1, 9, (1,), generator=generator))
            tokens.append(torch.randint(0, 2, (length,), generator=generator).tolist())
            rewards.append(float(torch.randint(0, 3, (1,), generator=generator)) / 2)
            groups.append(g)
    batch = _batch(tokens, rewards, groups)
    positions = torch.randint(1, 7, (30, 3), generator=generator)
    positions[::4, 2] = -1
    events = fork_events(batch, positions, tau=0.25)
    expected_fired, expected_usable = [], []
    for g in range(30):
        members = [i for i, group in enumerate(groups) if group == g]
        for p in positions[g].tolist():
            if p < 0:
                continue
            classes: dict[tuple, list[float]] = {}
            for i in members:
                key = tuple(tokens[i][:p]) if len(tokens[i]) >= p else ("whole",) + tuple(tokens[i])
                classes.setdefault(key, []).append(rewards[i])
            shared = [values for values in classes.values() if len(values) >= 2]
            expected_fired.append(bool(shared))
            expected_usable.append(any(max(v) - min(v) > 0.25 for v in shared))
    assert events.fired.tolist() == expected_fired
    assert events.usable.tolist() == expected_usable


def test_wilson_interval_by_hand():
    # k = 8 of n = 10: centre (0.8 + 1.92/10) / 1.384 = 0.71683, half = 1.96/1.384 * sqrt(0.016 + 0.009604)
    low, high = wilson_interval(torch.tensor(8), torch.tensor(10), z=1.96)
    centre = (0.8 + 1.96**2 / 20) / (1 + 1.96**2 / 10)
    half = 1.96 / (1 + 1.96**2 / 10) * math.sqrt(0.8 * 0.2 / 10 + 1.96**2 / 400)
    assert float(low) == pytest.approx(centre - half) and float(high) == pytest.approx(centre + half)
    assert float(low) == pytest.approx(0.4902, abs=1e-4) and float(high) == pytest.approx(0.9433, abs=1e-4)
    low, high = wilson_interval(torch.tensor(0), torch.tensor(5))
    assert float(low) == pytest.approx(0.0, abs=1e-12) and 0 < float(high) < 1


def test_depth_quantiles_are_the_inverse_empirical_cdf():
    positions = torch.tensor([5, 1, 3, 2, 4, 10, 7, 6, 9, 8])  # 1 … 10
    assert depth_quantile(positions, 0.5) == 5
    assert depth_quantile(positions, 0.9) == 9
    assert depth_quantile(positions, 0.99) == 10
    assert depth_quantile(positions, 0.91) == 10
    assert depth_quantile(torch.tensor([3]), 0.5) == 3
    assert depth_quantile(torch.zeros(0, dtype=torch.int64), 0.5) is None


def test_summary_and_per_position_rows_on_known_events():
    batch = _batch(TOKENS, REWARDS, GROUPS)
    report = ForkabilityReport("cell", tau=0.0)
    report.add(fork_events(batch, torch.tensor([[2, 3], [2, 4]])), 2)
    report.add(fork_events(batch, torch.tensor([[1, -1], [3, -1]])), 2)
    # second batch: g3@1 all start with 4 (3 members, spread 0.6) usable; g7@3 usable
    row = report.summary(resamples=200)
    assert (row["attempts"], row["fired"], row["usable"]) == (6, 4, 3)
    assert row["r_f"] == pytest.approx(0.5) and row["fire_rate"] == pytest.approx(4 / 6)
    assert row["group_size"] == pytest.approx((2 + 3 + 3 + 2) / 4)
    assert row["reward_spread"] == pytest.approx((0.0 + 0.8 + 0.6 + 0.8) / 4)
    assert row["mu_pos"] == pytest.approx((2 + 1 + 3) / 3)
    assert (row["p50"], row["p90"], row["last"], row["n_pos"]) == (2, 3, 3, 3)
    assert row["r_f_boot_low"] <= row["r_f"] <= row["r_f_boot_high"]
    by_position = {r["position"]: (r["attempts"], r["fired"], r["usable"]) for r in report.per_position()}
    assert by_position == {1: (1, 1, 1), 2: (2, 2, 1), 3: (2, 1, 1), 4: (1, 0, 0)}


def test_position_bootstrap_resamples_positions():
    # two positions: 10/10 usable and 0/10 usable -> resampled pooled rates are 0, 0.5 or 1
    report = ForkabilityReport("cell", tau=0.0)
    from leaf_plugins.analysis.forkability import ForkEvents

    position = torch.tensor([3] * 10 + [8] * 10)
    usable = torch.tensor([True] * 10 + [False] * 10)
    empty = torch.zeros(0, dtype=torch.int64)
    report.add(ForkEvents(position, usable.clone(), usable, empty, empty.double(), empty), 20)
    row = report.summary(resamples=1000)
    assert row["r_f"] == 0.5 and row["r_f_boot_low"] == 0.0 and row["r_f_boot_high"] == 1.0


def test_forkability_from_batches_uses_the_leaf_boundaries():
    # surprisal peaks at t = 2 and t = 6 in every response: LEAF picks P = {2, 6} (lmin 9, B 2)
    tokens = [[1] * 6 + [2, 3, 4], [1] * 6 + [5, 6, 7], [1, 1, 8, 8, 8, 8, 8, 8, 8]]
    surprisal = [[0.1, 0.1, 5.0, 0.1, 0.1, 0.1, 4.0, 0.1, 0.1]] * 3
    batch = _batch(tokens, [1.0, 0.0, 0.5], [0, 0, 0], surprisal)
    assert estimate(batch, "leaf", fork_budget=2).boundaries == [[2, 6]]
    report = forkability_from_batches([batch], fork_budget=2, tau=0.0, label="t")
    events = report.events
    assert events.position.tolist() == [2, 6]
    assert events.fired.tolist() == [True, True] and events.usable.tolist() == [True, True]
    assert report.summary(resamples=100)["group_size"] == pytest.approx((3 + 2) / 2)
