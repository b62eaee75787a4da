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


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.float32])
def test_first_difference_names_a_dtype_it_does_not_compare(dtype):
    rows = torch.zeros(2, 4, dtype=dtype)
    with pytest.raises(TypeError, match=f"int32 or int64 rows, got {dtype}"):
        first_difference(rows, rows)


@pytest.mark.parametrize("width", [1, 2, 17, 31, 32, 33, 63, 64, 65, 1024, 4095])
@pytest.mark.parametrize("large", [False, True])
def test_block_search_finds_the_longest_common_prefix(width, large):
    """Block hashes, then tokens inside the first block that differs, give each pair's LCP
    (rows that share a random prefix, identical rows, rows that differ at once, rows that
    part at a block's first or last column), at widths around multiples of the block, with
    int32 rows and with token ids past 2**31 (int64 rows)."""
    from leaf_plugins.estimators.machinery.prefixes import BLOCK, _block_lcp, block_hashes, compact_tokens

    generator = torch.Generator().manual_seed(width)
    rows = 12
    offset = 2**40 if large else 0
    trunk = torch.randint(0, 5, (width,), generator=generator) + offset
    shared = torch.randint(0, width + 1, (rows,), generator=generator)
    shared[0] = shared[1] = width  # two identical rows
    shared[2] = 0
    shared[3], shared[4] = min(BLOCK, width), min(BLOCK - 1, width)  # parting at a block's edge
    fresh = torch.randint(5, 9, (rows, width), generator=generator) + offset
    tokens = torch.where(torch.arange(width) < shared.unsqueeze(1), trunk, fresh)
    compact = compact_tokens(tokens, offset + 9)
    assert compact.dtype == (torch.int64 if large else torch.int32) and compact.shape[1] % BLOCK == 0
    left, right = torch.triu_indices(rows, rows, 1)  # every pair
    found = _block_lcp(compact, block_hashes(compact), left.view(2, -1), right.view(2, -1)).clamp(max=width)
    expected = first_difference_by_hand(tokens[left].tolist(), tokens[right].tolist())
    assert found.view(-1).tolist() == expected


@pytest.mark.parametrize("tokens", [[[2, 1, 8, 8], [1, 2, 8, 8]], [[5, 2, 1], [5, 1, 2], [5, 2, 1]]])
def test_order_catches_colliding_block_hashes(tokens, monkeypatch):
    """With every multiplier 1 a block hash is a token sum: rows whose tokens are swapped
    inside a block hash alike and the search takes them for equal. The exact check of the
    order must fail and the plain sort decide."""
    import leaf_plugins as lp
    from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

    exact_sorts = collide_hashes_and_count_exact_sorts(monkeypatch)
    batch = lp.RolloutBatch.from_lists(tokens, [0.0] * len(tokens), [0] * len(tokens))
    found = SortedPrefixes.lexicographic(batch)
    assert exact_sorts, "the colliding hashes were never caught"
    assert batch.tokens[found.order].tolist() == sorted(tokens)


def _classes_at(tokens: list[list[int]], position: int):
    """Prefix classes of one group at one boundary."""
    import leaf_plugins as lp
    from leaf_plugins.estimators.machinery.prefix_classes import PrefixClasses

    batch = lp.RolloutBatch.from_lists(tokens, [0.0] * len(tokens), [0] * len(tokens))
    return PrefixClasses.at_boundaries(batch, torch.tensor([[position]]))


@pytest.mark.parametrize("position", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("width", [8, 9])
def test_proof_accepts_members_that_part_right_at_the_boundary(position, width, monkeypatch):
    """Rows that share exactly their first ``p`` tokens are one class at ``p`` without the
    exact sort, at odd and even ``p`` and row widths (the proof's first differing hash
    column lies at the boundary or after it)."""
    refuse_exact_sort(monkeypatch, "the proof failed on classes that are exact")
    trunk = [3, 1, 4, 1, 5, 9, 2, 6, 5][:position]
    tokens = [trunk + [7 + row] * (width - position) for row in range(4)]
    classes = _classes_at(tokens, position)
    assert classes.size.view(-1).tolist() == [4, 4, 4, 4]
    assert classes.first.view(-1).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("position", [2, 3, 4, 5])
def test_proof_rejects_a_collision_just_before_the_boundary(position, monkeypatch):
    """With every multiplier 1 a hash is a token sum: rows whose tokens at ``p - 2`` and
    ``p - 1`` are swapped hash alike at ``p``. The proof must fail and the exact sort
    must split them, whatever the parity of ``p``."""
    exact_sorts = collide_hashes_and_count_exact_sorts(monkeypatch)
    trunk = [3, 1, 4, 1, 5][: position - 2]
    tokens = [trunk + [1, 2, 8, 8], trunk + [2, 1, 8, 8]]
    classes = _classes_at(tokens, position)
    assert exact_sorts, "the colliding hashes were never caught"
    assert classes.size.view(-1).tolist() == [1, 1]


def test_int32_running_hashes_are_the_sums_modulo_2_32():
    """int32 hashes (summed in int64, then narrowed) equal the sums of token times the
    int32 multipliers in int32 arithmetic (wrapping modulo 2**32), the spare column
    included."""
    from leaf_plugins.estimators.machinery.prefixes import _odd_multipliers, running_hashes

    tokens = torch.tensor([[2**31 - 1, -1, 7], [0, 5, 2**30]])
    out = torch.empty(2, 4, dtype=torch.int32)
    running_hashes(tokens, torch.int32, out=out)
    multipliers = [int(m) for m in _odd_multipliers(4, torch.int32, "cpu")]
    for row, found in zip(tokens.tolist(), out.tolist()):
        total, expected = 0, []
        for token, multiplier in zip(row + [0], multipliers):
            total = (total + token * multiplier) % 2**32
            expected.append(total - 2**32 if total >= 2**31 else total)
        assert found == expected


@pytest.mark.parametrize("seed", range(40))
def test_lexicographic_order_equals_a_plain_sort_of_the_rows(seed):
    """The hashed order (int32 rows, or int64 ones where token ids reach 2**31) has the
    same rows in the same places and the same adjacent LCPs as a direct sort, at odd and
    even widths, with identical and empty responses."""
    import random

    import leaf_plugins as lp
    from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

    rng = random.Random(seed)
    groups, size, width = rng.randint(1, 4), rng.randint(1, 6), rng.choice([0, 1, 2, 3, 8, 13])
    large = seed % 4 == 0  # token ids past the int32 range: int64 hashes
    rows = []
    for _ in range(groups):
        trunk = [rng.randint(0, 2) + (2**40 if large else 0) for _ in range(width)]
        for _ in range(size):
            cut, length = rng.randint(0, width), rng.randint(0, width)
            rows.append((trunk[:cut] + [rng.randint(0, 2) for _ in range(width - cut)])[:length])
    ids = [g for g in range(groups) for _ in range(size)]
    rng.shuffle(ids)
    batch = lp.RolloutBatch.from_lists(rows, [0.0] * len(rows), ids)
    hashed, plain = SortedPrefixes.lexicographic(batch), SortedPrefixes.lexicographic_exact(batch)
    assert torch.equal(batch.tokens[hashed.order], batch.tokens[plain.order])
    assert torch.equal(hashed.lcp, plain.lcp) and torch.equal(hashed.group, plain.group)
    padded = batch.tokens[hashed.order].tolist()  # sorted rows, -1 padded to the width
    expected = [-1] + [-1 if hashed.group[k] != hashed.group[k - 1] else
                       next((t for t, (a, b) in enumerate(zip(padded[k - 1], padded[k])) if a != b), batch.width)
                       for k in range(1, len(padded))]
    assert hashed.lcp.tolist() == expected  # against a loop over the tokens, not the shared comparison


@pytest.mark.parametrize("seed", range(30))
def test_prefix_classes_read_off_the_order_equal_the_hashed_ones(seed):
    """``PrefixClasses.from_order`` and ``at_boundaries`` agree on random groups (ragged
    ones included) at used and unused boundaries."""
    from estimator_cases import random_groups, to_batch
    from leaf_plugins.estimators.machinery.prefix_classes import PrefixClasses
    from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

    batch, _ = to_batch(random_groups(seed, max_len=12), shuffle_seed=seed)
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(-1, batch.width + 1, (batch.groups.count, 3), generator=generator).sort(dim=1).values
    hashed = PrefixClasses.at_boundaries(batch, positions)
    read = PrefixClasses.from_order(batch, positions, SortedPrefixes.lexicographic(batch))
    real = (hashed.size > 0) | (read.size > 0)  # slots in a class in either
    assert torch.equal(hashed.size, read.size) and torch.equal(hashed.reward_sum, read.reward_sum)
    assert torch.equal(hashed.first[real], read.first[real])
