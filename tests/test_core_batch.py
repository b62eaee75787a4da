"""RolloutBatch construction, validation and group layout."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins import RolloutBatch


def test_from_lists_pads_with_minus_one_and_zero():
    batch = RolloutBatch.from_lists([[5, 6, 7], [8]], [1.0, 0.0], [3, 3], surprisal=[[0.1, 0.2, 0.3], [0.4]])
    assert batch.tokens.tolist() == [[5, 6, 7], [8, -1, -1]]
    assert batch.lengths.tolist() == [3, 1]
    assert torch.allclose(batch.surprisal, torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]]))
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.tokens.dtype == torch.int64 and batch.rewards.dtype == torch.float32


def test_groups_are_numbered_by_ascending_id_and_may_differ_in_size():
    batch = RolloutBatch.from_lists([[1], [2], [3], [4], [5]], [0, 0, 0, 0, 0], [9, 2, 9, 9, 2])
    assert batch.groups.ids.tolist() == [2, 9]
    assert batch.groups.index.tolist() == [1, 0, 1, 1, 0]
    assert batch.groups.sizes.tolist() == [2, 3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tokens=[[1, 2]], rewards=[1.0, 2.0], group_ids=[0]), "one entry per response"),
        (dict(tokens=[[1, -3]], rewards=[1.0], group_ids=[0]), r"tokens\[0\]"),
        (dict(tokens=[[1, 2]], rewards=[1.0], group_ids=[0], surprisal=[[0.5]]), r"surprisal\[0\] has 1 values"),
    ],
)
def test_from_lists_rejects_bad_input_naming_the_culprit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutBatch.from_lists(**kwargs)


def test_constructor_checks_shapes():
    with pytest.raises(ValueError, match=r"rewards must be \[N\]"):
        RolloutBatch(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 3]), torch.tensor([0, 0]), torch.zeros(3))
    with pytest.raises(ValueError, match="lengths must lie"):
        RolloutBatch(torch.zeros(1, 3, dtype=torch.long), torch.tensor([4]), torch.tensor([0]), torch.zeros(1))


def test_select_and_with_rewards_keep_layout_consistent():
    batch = RolloutBatch.from_lists([[1, 2], [3], [4, 5]], [0.1, 0.2, 0.3], [0, 1, 0])
    part = batch.select(torch.tensor([2, 0]))
    assert part.tokens.tolist() == [[4, 5], [1, 2]] and part.groups.sizes.tolist() == [2]
    assert batch.with_rewards(torch.tensor([1.0, 2.0, 3.0])).rewards.tolist() == [1.0, 2.0, 3.0]


def test_call_cache_computes_once_and_lives_for_one_estimator_call():
    """A value several stages of one call ask for is computed once; the engine forgets it
    when the call ends, so the next call (on the same batch) computes it again; a batch
    with other rewards starts with an empty cache."""
    import leaf_plugins as lp
    from leaf_plugins.core.hookspecs import hookimpl

    batch = RolloutBatch.from_lists([[1, 2], [1, 3]], [0.0, 1.0], [0, 0])
    computed = []

    def count() -> int:
        computed.append(1)
        return len(computed)

    class Asking:  # an estimator that asks in two of its stages
        @hookimpl
        def retain_nodes(self, batch, boundaries, params):  # noqa: ANN001
            batch.call_cached("test.count", count)
            return lp.root_only_nodes(batch)

        @hookimpl
        def compute_advantages(self, batch, nodes, params):  # noqa: ANN001
            batch.call_cached("test.count", count)
            return torch.zeros(batch.tokens.shape)

    class Register:
        @hookimpl
        def register_estimators(self, register):  # noqa: ANN001
            register("asking", Asking())

    assert batch.call_cached("test.count", count) == 1 and batch.call_cached("test.count", count) == 1
    batch.clear_call_cache()
    engine = lp.Engine("asking", host=lp.core.plugins.PluginHost.discover(extra_plugins=[("asking", Register())],
                                                                          strict=True))
    engine.estimate(batch)
    assert len(computed) == 2  # once in the call, though two stages asked
    engine.estimate(batch)
    assert len(computed) == 3 and batch._call_cache == {}
    batch.call_cached("test.count", count)
    assert batch.with_rewards(torch.tensor([2.0, 3.0]))._call_cache == {}
