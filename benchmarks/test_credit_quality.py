"""Credit quality as pytest-benchmark runs: the time of one measurement per estimator in
the base regime, with the quality figures attached through ``extra_info``.

Run: python -m pytest benchmarks/test_credit_quality.py --benchmark-only
"""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of, estimator_names
from leaf_plugins.bench.credit.measures import measure_credit
from leaf_plugins.bench.credit.sampling import sample_groups


@pytest.mark.parametrize("estimator", estimator_names())
def test_credit_quality(benchmark, estimator):
    env = Environment.build(Regime(), seed=0)
    groups = sample_groups(env, 200, torch.Generator().manual_seed(0))

    def measure():
        advantages, _ = advantages_of(estimator, env, groups)
        return measure_credit(env, groups, advantages)

    result = benchmark(measure)
    benchmark.extra_info.update(
        estimator=estimator,
        gradient_cosine=result.cosine.mean,
        gradient_cosine_ci=result.cosine.half_width,
        nmse_best_scale=result.nmse,
        mean_gradient_cosine=result.mean_gradient_cosine,
        token_correlation=result.token_correlation.mean,
    )
    assert -1.0 <= result.cosine.mean <= 1.0
