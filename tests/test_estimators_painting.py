"""Writing piecewise-constant rows: both painting methods against a plain Python one,
and the tree estimators on a batch large enough for block painting."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leaf_plugins as lp
from leaf_plugins.estimators.machinery import painting


def painted_in_python(values: list[list[float]], sizes: list[list[int]]) -> list[list[float]]:
    return [[value for value, size in zip(row_values, row_sizes) for _ in range(size)]
            for row_values, row_sizes in zip(values, sizes)]


@st.composite
def segment_tables(draw):
    """Rows of segments (empty ones included) that fill a common width."""
    rows = draw(st.integers(min_value=1, max_value=6))
    width = draw(st.integers(min_value=0, max_value=70))
    segments = draw(st.integers(min_value=1, max_value=6))
    sizes = []
    for _ in range(rows):
        cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=width), min_size=segments - 1,
                                    max_size=segments - 1)))
        edges = [0] + cuts + [width]
        sizes.append([b - a for a, b in zip(edges, edges[1:])])
    values = [[float(draw(st.integers(min_value=-9, max_value=9))) for _ in range(segments)] for _ in range(rows)]
    return values, sizes, width


@settings(max_examples=300, deadline=None)
@given(table=segment_tables(), block=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_both_methods_paint_what_python_paints(table, block):
    values, sizes, width = table
    expected = torch.tensor(painted_in_python(values, sizes)).view(len(values), width)
    value_tensor, size_tensor = torch.tensor(values), torch.tensor(sizes)
    assert torch.equal(painting.paint_by_lookup(value_tensor, size_tensor, width), expected)
    assert torch.equal(painting.paint_by_blocks(value_tensor, size_tensor, width, block), expected)


def test_block_painting_of_one_token_segments():
    """A row of one-token segments: every token is its own block remainder."""
    values = torch.arange(40, dtype=torch.float32).view(2, 20)
    sizes = torch.ones(2, 20, dtype=torch.int64)
    assert torch.equal(painting.paint_by_blocks(values, sizes, 20, block=16), values)


def branching_batch(prompts: int, size: int, width: int) -> lp.RolloutBatch:
    """Responses that share their prompt's trunk up to a random depth, ragged lengths."""
    generator = torch.Generator().manual_seed(3)
    trunks = torch.randint(0, 50, (prompts, width), generator=generator).repeat_interleave(size, dim=0)
    fresh = torch.randint(0, 50, trunks.shape, generator=generator)
    positions = torch.arange(width)
    tokens = torch.where(positions < torch.randint(1, width, (len(trunks), 1), generator=generator), trunks, fresh)
    lengths = torch.randint(width // 2, width + 1, (len(trunks),), generator=generator)
    inside = positions < lengths.unsqueeze(1)
    return lp.RolloutBatch(torch.where(inside, tokens, -1), lengths, torch.arange(prompts).repeat_interleave(size),
                           torch.rand(len(trunks), generator=generator),
                           surprisal=torch.where(inside, torch.rand(tokens.shape, generator=generator), 0.0))


@pytest.mark.parametrize("estimator", ["leaf", "collision", "full_tree"])
def test_large_batches_are_painted_by_blocks_with_the_same_result(estimator, monkeypatch):
    batch = branching_batch(32, 8, 601)  # 153,856 positions: above BLOCKS_FROM
    assert batch.size * batch.width >= painting.BLOCKS_FROM
    calls = []
    by_blocks = painting.paint_by_blocks
    monkeypatch.setattr(painting, "paint_by_blocks", lambda *args: calls.append(1) or by_blocks(*args))
    blocks = lp.estimate(batch, estimator).advantages
    assert calls, "the block painting was not used"
    monkeypatch.setattr(painting, "BLOCKS_FROM", 10**12)
    assert torch.equal(blocks, lp.estimate(batch, estimator).advantages)
    assert blocks.is_contiguous() and blocks.shape == batch.tokens.shape
