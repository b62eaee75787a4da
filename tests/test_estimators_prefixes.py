"""Row comparisons behind the exact prefix proofs, against plain Python."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator_cases import collide_hashes_and_count_exact_sorts, refuse_exact_sort
from leaf_plugins.estimators.machinery.prefixes import first_difference


def first_difference_by_hand(upper: list[list[int]], lower: list[list[int]]) -> list[int]:
    """The first column where each pair of rows differs, the width if none."""
    found = []
    for a, b in zip(upper, lower):
        found.append(next((column for column, (x, y) in enumerate(zip(a, b)) if x != y), len(a)))
    return found


@st.composite
def row_pairs(draw):
    """Pairs of equal-width rows that agree on a random prefix, with small values so that
    the rest of the row often agrees by chance too."""
    rows = draw(st.integers(0, 6))
    width = draw(st.integers(0, 40))
    upper, lower = [], []
    for _ in range(rows):
        a = draw(st.lists(st.integers(-3, 3), min_size=width, max_size=width))
        shared = draw(st.integers(0, width))
        tail = draw(st.lists(st.integers(-3, 3), min_size=width - shared, max_size=width - shared))
        upper.append(a)
        lower.append(a[:shared] + tail)
    return upper, lower, width


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@given(case=row_pairs())
@settings(max_examples=150, deadline=None)
def test_first_difference_matches_python(dtype, case):
    upper, lower, width = case
    shape = (len(upper), width)
    found = first_difference(torch.tensor(upper, dtype=dtype).view(shape), torch.tensor(lower, dtype=dtype).view(shape))
    assert found.dtype == torch.int64
    assert found.tolist() == first_difference_by_hand(upper, lower)


def test_first_difference_on_rows_wider_than_int16_counts():
    """Rows wider than 32,767 columns, differing at the first column, past the int16
    range, or at the last column in the sign bit only."""
    width = 40_000
    upper = torch.zeros(4, width, dtype=torch.int64)
    lower = upper.clone()
    lower[0, 0] = 1  # first column
    lower[1, width - 1] = torch.iinfo(torch.int64).min  # last column, sign bit only
    lower[2, 32_768] = -1  # just past the int16 range
    # row 3 equal throughout
    assert first_difference(upper, lower).tolist() == [0, width - 1, 32_768, width]


@pytest.mark.parametrize("width", [1, 2, 17, 63, 64, 65, 1024, 4095, 4096])
def test_hash_lcp_search_finds_the_longest_common_prefix(width):
    """The binary search over running hashes returns each pair's LCP (rows that share a
    random prefix, identical rows, rows that differ at once), at widths around powers of
    two, where the search takes one round more or less."""
    from leaf_plugins.estimators.machinery.prefixes import _hash_lcp, running_hashes

    generator = torch.Generator().manual_seed(width)
    rows = 12
    trunk = torch.randint(0, 5, (width,), generator=generator)
    shared = torch.randint(0, width + 1, (rows,), generator=generator)
    shared[0] = shared[1] = width  # two identical rows
    shared[2] = 0
    fresh = torch.randint(5, 9, (rows, width), generator=generator)
    tokens = torch.where(torch.arange(width) < shared.unsqueeze(1), trunk, fresh)
    left, right = torch.triu_indices(rows, rows, 1)  # every pair
    found = _hash_lcp(running_hashes(tokens), left.view(2, -1), right.view(2, -1))
    expected = first_difference_by_hand(tokens[left].tolist(), tokens[right].tolist())
    assert found.view(-1).tolist() == expected


def _classes_at(tokens: list[list[int]], position: int):
    """Prefix classes of one group at one boundary."""
    import leaf_plugins as lp
    from leaf_plugins.estimators.machinery.prefix_classes import PrefixClasses

    batch = lp.RolloutBatch.from_lists(tokens, [0.0] * len(tokens), [0] * len(tokens))
    return PrefixClasses.at_boundaries(batch, torch.tensor([[position]]))


@pytest.mark.parametrize("position", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("width", [8, 9])
def test_proof_on_column_pairs_accepts_members_that_part_right_at_the_boundary(position, width, monkeypatch):
    """Rows that share exactly their first ``p`` tokens are one class at ``p`` without the
    exact sort, at odd and even ``p`` and row widths (the proof compares int32 hashes as
    int64 column pairs, and a pair may straddle the boundary)."""
    refuse_exact_sort(monkeypatch, "the proof failed on classes that are exact")
    trunk = [3, 1, 4, 1, 5, 9, 2, 6, 5][:position]
    tokens = [trunk + [7 + row] * (width - position) for row in range(4)]
    classes = _classes_at(tokens, position)
    assert classes.size.view(-1).tolist() == [4, 4, 4, 4]
    assert classes.first.view(-1).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("position", [2, 3, 4, 5])
def test_proof_on_column_pairs_rejects_a_collision_just_before_the_boundary(position, monkeypatch):
    """With every multiplier 1 a hash is a token sum: rows whose tokens at ``p - 2`` and
    ``p - 1`` are swapped hash alike at ``p``. The proof must fail and the exact sort
    must split them, whatever the parity of ``p``."""
    exact_sorts = collide_hashes_and_count_exact_sorts(monkeypatch)
    trunk = [3, 1, 4, 1, 5][: position - 2]
    tokens = [trunk + [1, 2, 8, 8], trunk + [2, 1, 8, 8]]
    classes = _classes_at(tokens, position)
    assert exact_sorts, "the colliding hashes were never caught"
    assert classes.size.view(-1).tolist() == [1, 1]
