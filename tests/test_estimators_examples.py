"""The spec's worked examples and hand-computed GRPO cases."""

from __future__ import annotations

import math

import pytest
import torch

import leaf_plugins as lp
from reference_estimators import Response, full_tree, leaf

V0 = (1.0 + 0.8 + 0.6 + 0.2 + 0.0 + 0.5) / 6


def figure_one_batch() -> lp.RolloutBatch:
    """Paper Figure 1: responses 1–3 share 6 tokens, 4–5 share 6, response 6 shares only
    the first 2; t = 2 and t = 6 carry the largest surprisals."""
    trunk, blue, orange = [1, 2], [3, 4, 5, 6], [7, 8, 9, 10]
    tokens = [
        trunk + blue + [20, 21, 22],
        trunk + blue + [23, 24, 25],
        trunk + blue + [26, 27, 28],
        trunk + orange + [29, 30, 31],
        trunk + orange + [32, 33, 34],
        trunk + [40, 41, 42, 43, 44, 45, 46],
    ]
    surprisal = [[0.1] * 9 for _ in tokens]
    surprisal[2][2], surprisal[0][6] = 5.0, 4.0
    surprisal[4][7], surprisal[5][8] = 3.0, 2.0  # rejected by Δ, then by the budget
    return lp.RolloutBatch.from_lists(tokens, [1.0, 0.8, 0.6, 0.2, 0.0, 0.5], [0] * 6, surprisal=surprisal)


def test_leaf_figure_one_raw_advantages_by_hand():
    result = lp.estimate(figure_one_batch(), "leaf", fork_budget=2, normalize="none")
    assert result.boundaries == [[2, 6]]
    blue = ((0.8 - V0) * 2) / math.sqrt(3)
    orange = ((0.1 - V0) * 2) / math.sqrt(2)
    expected = [
        [0, 0] + [blue] * 4 + [(1.0 - V0) + (1.0 - 0.8)] * 3,
        [0, 0] + [blue] * 4 + [(0.8 - V0) + (0.8 - 0.8)] * 3,
        [0, 0] + [blue] * 4 + [(0.6 - V0) + (0.6 - 0.8)] * 3,
        [0, 0] + [orange] * 4 + [(0.2 - V0) + (0.2 - 0.1)] * 3,
        [0, 0] + [orange] * 4 + [(0.0 - V0) + (0.0 - 0.1)] * 3,
        [0, 0] + [2 * (0.5 - V0)] * 7,
    ]
    assert torch.allclose(result.advantages, torch.tensor(expected), atol=1e-6)
    # the spec's rounded figures
    assert result.advantages[0, 2].item() == pytest.approx(0.327, abs=5e-4)
    assert result.advantages[3, 2].item() == pytest.approx(-0.589, abs=5e-4)
    assert result.advantages[5, 3].item() == pytest.approx(-0.033, abs=5e-4)
    nodes = [(n.position, n.members, round(n.value, 5)) for n in result.nodes[0]]
    assert nodes == [(2, (0, 1, 2, 3, 4, 5), round(V0, 5)), (6, (0, 1, 2), 0.8), (6, (3, 4), 0.1)]


def test_leaf_span_normalisation_by_hand():
    result = lp.estimate(figure_one_batch(), "leaf", normalize="span")
    raw = lp.estimate(figure_one_batch(), "leaf", normalize="none").advantages
    # every non-empty span, one entry each: [0, 2) of all six responses, [2, 6) and the
    # tail [6, 9) of responses 1–5, the tail [2, 9) of response 6
    spans = [raw[i, 0].item() for i in range(6)] + [raw[i, 2].item() for i in range(6)] + [raw[i, 6].item() for i in range(5)]
    mean = sum(spans) / len(spans)
    std = math.sqrt(sum((s - mean) ** 2 for s in spans) / (len(spans) - 1))
    assert torch.allclose(result.advantages, (raw - mean) / std, atol=1e-5)


def test_leaf_each_horizon_counts_spans_past_a_short_responses_end_by_hand():
    """Spec, LEAF step 4 (the authors' rule): two identical short responses sit in nodes
    at p = 3 and p = 6, both past their end (H = 2), keyed by their whole sequence; the
    span [3, 6) holds none of their tokens but is still an entry of the z-score."""
    tokens = [[1, 2], [1, 2], [1, 3, 4, 5, 6, 7, 8, 9], [1, 3, 4, 5, 11, 12, 13, 14]]
    surprisal = [[0.1] * len(t) for t in tokens]
    surprisal[2][3], surprisal[3][6] = 5.0, 4.0  # horizon each: candidates up to each H_i - 1
    batch = lp.RolloutBatch.from_lists(tokens, [1.0, 0.6, 0.0, 0.2], [0] * 4, surprisal=surprisal)
    raw = lp.estimate(batch, "leaf", horizon="each", normalize="none")
    assert raw.boundaries == [[3, 6]]  # lmin = 2, B = 2: Δ = 2
    nodes = [(n.position, n.members, round(n.value, 6)) for n in raw.nodes[0]]
    assert nodes == [(3, (0, 1), 0.8), (3, (2, 3), 0.1), (6, (0, 1), 0.8)]
    v0 = 0.45
    first_short = 2 * (0.8 - v0) / math.sqrt(2)  # [0, 3): GA + LA over sqrt(2)
    past_end = (0.8 - v0) / math.sqrt(2)  # [3, 6): GA only, LA = 0; no token of y1, y2
    first_long = 2 * (0.1 - v0) / math.sqrt(2)  # [0, 3) of y3, y4
    tail3, tail4 = (0.0 - v0) + (0.0 - 0.1), (0.2 - v0) + (0.2 - 0.1)  # [3, 8)
    expected_raw = [[first_short] * 2, [first_short] * 2, [first_long] * 3 + [tail3] * 5, [first_long] * 3 + [tail4] * 5]
    for row, want in zip(raw.advantages.tolist(), expected_raw):
        assert row[: len(want)] == pytest.approx(want, abs=1e-6)  # float32 output of float64 values
    # entries: two spans of each short response (no tail: p(v_q) = 6 >= H = 2), two of each long one
    entries = [first_short, past_end, first_short, past_end, first_long, tail3, first_long, tail4]
    mean = sum(entries) / len(entries)
    std = math.sqrt(sum((e - mean) ** 2 for e in entries) / (len(entries) - 1))
    result = lp.estimate(batch, "leaf", horizon="each", normalize="span")
    for row, want in zip(result.advantages.tolist(), expected_raw):
        assert row[: len(want)] == pytest.approx([(w - mean) / std for w in want], abs=1e-5)  # float32, |z| < 3
    # counting only spans that hold tokens (dropping both `past_end`) gives other values
    held = [e for e in entries if e != past_end]
    held_mean = sum(held) / len(held)
    assert abs((first_short - held_mean) - (first_short - mean)) > 0.05


def test_full_tree_examples_from_the_spec():
    batch = lp.RolloutBatch.from_lists([[5, 7, 1, 2], [5, 7, 1, 3], [5, 8, 4], [6, 9]], [1, 0, 1, 0], [0] * 4)
    result = lp.estimate(batch, "full_tree", normalize="none")
    expected = [[0.19245, -0.117851, -0.117851, 1.0], [0.19245, -0.117851, -0.117851, -1.0],
                [0.19245, 0.833333, 0.833333, 0.0], [-1.0, -1.0, 0.0, 0.0]]
    assert torch.allclose(result.advantages, torch.tensor(expected), atol=1e-5)
    assert [(n.position, n.members) for n in result.nodes[0]] == [(1, (0, 1, 2)), (3, (0, 1))]

    identical = lp.RolloutBatch.from_lists([[2, 4, 6], [2, 4, 6], [2, 4, 7], [8]], [1, 1, 0, 0], [0] * 4)
    result = lp.estimate(identical, "full_tree", normalize="none")
    expected = [[0.19245, 0.19245, 0.589256], [0.19245, 0.19245, 0.589256], [0.19245, 0.19245, -1.166667],
                [-1.0, 0.0, 0.0]]
    assert torch.allclose(result.advantages, torch.tensor(expected), atol=1e-5)
    assert [(n.position, n.members) for n in result.nodes[0]] == [(2, (0, 1, 2)), (3, (0, 1))]


def test_reference_reproduces_the_spec_examples_too():
    group = [Response(list(t), r, [0.1] * len(t)) for t, r in
             [([5, 7, 1, 2], 1.0), ([5, 7, 1, 3], 0.0), ([5, 8, 4], 1.0), ([6, 9], 0.0)]]
    assert full_tree(group, normalize="none").advantages[2] == pytest.approx([0.19245, 0.833333, 0.833333], abs=1e-5)
    batch = figure_one_batch()
    responses = [Response(batch.tokens[i, :9].tolist(), batch.rewards[i].item(), batch.surprisal[i].tolist())
                 for i in range(6)]
    reference = leaf(responses, normalize="none")
    assert reference.boundaries == [2, 6]
    assert reference.advantages[0][6] == pytest.approx(0.683, abs=5e-4)


def test_grpo_by_hand():
    batch = lp.RolloutBatch.from_lists([[1, 2, 3], [4], [5, 6], [7]], [1.0, 0.0, 0.5, 0.3], [0, 0, 0, 1])
    result = lp.estimate(batch, "grpo")
    std = math.sqrt(((1 - 0.5) ** 2 + (0 - 0.5) ** 2 + 0) / 2)
    assert result.advantages[0, :3].tolist() == pytest.approx([0.5 / (std + 1e-6)] * 3)
    assert result.advantages[1, 0].item() == pytest.approx(-0.5 / (std + 1e-6))
    assert result.advantages[2].tolist() == [0.0, 0.0, 0.0]  # reward equals the mean; padding
    assert result.advantages[3].tolist() == [0.0, 0.0, 0.0]  # K = 1: never NaN
    floored = lp.estimate(batch, "grpo", std_floor=1.0).advantages
    assert floored[0, 0].item() == pytest.approx(0.5 / (1.0 + 1e-6))
    same = lp.RolloutBatch.from_lists([[1], [2]], [0.7, 0.7], [0, 0])
    assert lp.estimate(same, "grpo").advantages.tolist() == [[0.0], [0.0]]


def test_stage_override_combines_collision_boundaries_with_leaf_credit():
    batch = figure_one_batch()
    mixed = lp.estimate(batch, "leaf", stages={"select_boundaries": "collision"})
    collision = lp.estimate(batch, "collision")
    assert mixed.boundaries == collision.boundaries == [[1, 4]]
    assert torch.equal(mixed.advantages, collision.advantages)


def test_unknown_estimator_suggests_and_lists():
    with pytest.raises(lp.UnknownNameError, match=r"Unknown estimator 'fulltree'\. Did you mean 'full_tree'\?"):
        lp.estimate(figure_one_batch(), "fulltree")


@pytest.mark.parametrize("estimator", ["grpo", "leaf", "collision", "full_tree"])
def test_advantages_can_weight_a_differentiable_loss(estimator):
    """Estimators compute internally without autograd; their output must still be an
    ordinary tensor a loss can use."""
    batch = figure_one_batch()
    advantages = lp.estimate(batch, estimator).advantages
    assert not torch.is_inference(advantages)
    logprobs = torch.zeros(batch.tokens.shape, requires_grad=True)
    (advantages * logprobs).sum().backward()
    assert torch.equal(logprobs.grad, advantages)
