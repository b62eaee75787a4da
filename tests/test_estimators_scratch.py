"""Reusable scratch buffers: reuse, growth, per-thread isolation, and results that never
share memory with them."""

from __future__ import annotations

import threading

import pytest
import torch

import leaf_plugins as lp
from leaf_plugins.estimators.machinery.scratch import release_scratch, scratch
from estimator_cases import random_groups, to_batch

TREE_ESTIMATORS = ["leaf", "collision", "full_tree", "otb", "tree_otb"]


def test_a_purpose_reuses_its_buffer_and_grows_when_needed():
    release_scratch()
    first = scratch("test", (4, 5), torch.int64, torch.device("cpu"))
    again = scratch("test", (2, 3), torch.int64, torch.device("cpu"))
    assert again.data_ptr() == first.data_ptr() and again.shape == (2, 3) and again.is_contiguous()
    other = scratch("other", (4, 5), torch.int64, torch.device("cpu"))
    narrow = scratch("test", (4, 5), torch.int32, torch.device("cpu"))
    assert len({first.data_ptr(), other.data_ptr(), narrow.data_ptr()}) == 3
    grown = scratch("test", (10, 10), torch.int64, torch.device("cpu"))
    assert grown.shape == (10, 10) and grown.numel() == 100
    release_scratch()


def test_a_repeated_shape_gets_the_same_tensor_and_a_grown_buffer_a_new_one():
    release_scratch()
    first = scratch("test", (4, 5), torch.float32, torch.device("cpu"))
    assert scratch("test", (4, 5), torch.float32, torch.device("cpu")) is first  # no view operations
    narrower = scratch("test", (2, 5), torch.float32, torch.device("cpu"))
    assert narrower.data_ptr() == first.data_ptr() and narrower.shape == (2, 5)
    grown = scratch("test", (40, 5), torch.float32, torch.device("cpu"))
    again = scratch("test", (4, 5), torch.float32, torch.device("cpu"))
    assert again.data_ptr() == grown.data_ptr() and again.shape == (4, 5)  # the grown buffer, not the old one
    release_scratch()


def test_threads_get_their_own_buffers():
    buffers = {}  # the buffers themselves, kept alive: a dead thread's freed one could be reused

    def take(name):
        buffers[name] = scratch("test", (8,), torch.float32, torch.device("cpu"))

    threads = [threading.Thread(target=take, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert buffers["a"].data_ptr() != buffers["b"].data_ptr()


def policy_batch(seed: int, **kwargs) -> lp.RolloutBatch:
    """Random groups with the policy fields OTB's weights read: π = exp(−surprisal) of the
    sampled token, and the rest of the mass spread thin (Σπ² = π²)."""
    batch, _ = to_batch(random_groups(seed, **kwargs))
    logprobs = -batch.surprisal
    return lp.RolloutBatch(batch.tokens, batch.lengths, batch.group_ids, batch.rewards, surprisal=batch.surprisal,
                           logprobs=logprobs, sum_pi_squared=logprobs.mul(2).exp() * batch.mask)


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
def test_results_do_not_share_memory_with_later_calls(estimator):
    first_batch, second_batch = policy_batch(1, max_len=40), policy_batch(2, max_len=40)
    first = lp.estimate(first_batch, estimator)
    kept = [tensor.clone() for tensor in (first.advantages, first.node_table.path, first.node_table.position)]
    lp.estimate(second_batch, estimator)
    assert all(torch.equal(a, b) for a, b in zip(kept, (first.advantages, first.node_table.path,
                                                        first.node_table.position)))


@pytest.mark.parametrize("estimator", TREE_ESTIMATORS)
def test_concurrent_estimates_in_threads_agree_with_sequential_ones(estimator):
    batches = [policy_batch(seed, max_len=60, max_k=8) for seed in range(8)]
    expected = [lp.estimate(batch, estimator).advantages for batch in batches]
    got: dict[int, torch.Tensor] = {}

    def run(index: int) -> None:
        for _ in range(5):
            got[index] = lp.estimate(batches[index], estimator).advantages

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(got[index], expected[index]) for index in range(len(batches)))
