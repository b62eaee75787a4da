"""Estimator speed at three batch sizes and at a tiny one (the fixed cost of a call: its
tensor operations' dispatch, whatever the data), and the slow reference on the same batches.

Run: python -m pytest benchmarks/test_speed_estimators.py --benchmark-only
(``leaf bench speed`` runs this and prints the ratio table). The estimators: every
registered one at its defaults, or those ``LEAF_BENCH_ESTIMATORS`` names, one
``NAME[:P=V[,P=V]]`` choice per line (``leaf bench speed --estimator ...``). ``LEAF_BENCH_DEVICE=cuda``
(``leaf bench speed --device cuda``) times the estimators on that device, each call
synchronised before the clock stops; the slow references always run on the CPU.
``LEAF_BENCH_THREADS=N`` (``leaf bench speed --threads N``, default 1 there) sets torch's
CPU thread count for every call; each result records the count it ran at.
"""

from __future__ import annotations

import os

import pytest
import torch

import leaf_plugins as lp
from batches import SIZES, as_policy_groups, as_reference_groups, synthetic_batch
from leaf_plugins.bench.estimator_choice import estimator_choices
from reference_estimators import estimate_groups
from reference_otb import otb_groups

CHOICES = estimator_choices(os.environ.get("LEAF_BENCH_ESTIMATORS", "").splitlines())
ESTIMATORS = {choice.label: choice for choice in CHOICES}
DEVICE = torch.device(os.environ.get("LEAF_BENCH_DEVICE", "cpu"))
if os.environ.get("LEAF_BENCH_THREADS"):
    torch.set_num_threads(int(os.environ["LEAF_BENCH_THREADS"]))
_BATCHES: dict[str, lp.RolloutBatch] = {}


def batch_of(size: str) -> lp.RolloutBatch:
    if size not in _BATCHES:
        _BATCHES[size] = synthetic_batch(*SIZES[size])
    return _BATCHES[size]


def estimate_synchronised(engine: lp.Engine, batch: lp.RolloutBatch) -> lp.EstimateResult:
    """``engine.estimate(batch)``, returning once the device has finished it."""
    result = engine.estimate(batch)
    if batch.device.type == "cuda":
        torch.cuda.synchronize(batch.device)
    return result


# estimators of one size run one after the other, so that their ratios compare runs
# made under the same conditions (machine load, allocator state)
@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@pytest.mark.parametrize("size", list(SIZES))
def test_estimator_speed(benchmark, estimator, size):
    batch = batch_of(size).to(DEVICE)
    engine = ESTIMATORS[estimator].engine()
    benchmark.group = size
    benchmark.extra_info.update(estimator=estimator, size=size, tokens=int(batch.lengths.sum()), device=str(DEVICE),
                                threads=torch.get_num_threads())
    result = benchmark(estimate_synchronised, engine, batch)
    assert result.advantages.shape == batch.tokens.shape


REFERENCE_CASES = [case for case in [("grpo", "paper-6x8x200"), ("leaf", "paper-6x8x200"),
                                      ("collision", "paper-6x8x200"), ("otb", "paper-6x8x200"), ("leaf", "64x8x1024")]
                   if case[0] in ESTIMATORS]  # a reference of an estimator measured at its defaults


@pytest.mark.parametrize("estimator, size", REFERENCE_CASES)
def test_reference_speed(benchmark, estimator, size):
    benchmark.group = size
    benchmark.extra_info.update(estimator=f"{estimator} (reference)", size=size,
                                tokens=int(batch_of(size).lengths.sum()), threads=torch.get_num_threads())
    if estimator == "otb":
        run, args = otb_groups, (as_policy_groups(batch_of(size)),)
    else:
        run, args = estimate_groups, (as_reference_groups(batch_of(size)), estimator)
    benchmark.pedantic(run, args=args, rounds=3, iterations=1, warmup_rounds=1)
