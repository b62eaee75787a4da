"""The estimators the benchmark compares (every registered one, or those the user
names with their parameters), and the exact oracle."""

from __future__ import annotations

from functools import lru_cache

import torch

from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.bench.credit.exact import true_advantages
from leaf_plugins.bench.credit.sampling import Groups
from leaf_plugins.bench.estimator_choice import EstimatorChoice
from leaf_plugins.core.engine import Engine
from leaf_plugins.core.plugins import get_host
from leaf_plugins.core.tree import EstimateResult

__all__ = ["ORACLE", "estimator_names", "advantages_of"]

ORACLE = "oracle (true Q-V)"


def estimator_names() -> list[str]:
    """Every registered estimator (third-party ones included), then the oracle."""
    return get_host().estimators.names() + [ORACLE]


@lru_cache(maxsize=64)
def _engine(choice: EstimatorChoice, fork_budget: int) -> Engine:
    return choice.engine({"fork_budget": fork_budget})


def advantages_of(estimator: str | EstimatorChoice, env: Environment,
                  groups: Groups) -> tuple[torch.Tensor, list[EstimateResult]]:
    """``[N, H]`` advantages of ``estimator`` (a registered name at its defaults, or a
    choice with parameters; the regime's fork budget where it reads one and the choice
    does not set it), called on batches of the regime's ``batch_groups`` groups, and the
    estimate results (none for the oracle)."""
    if estimator == ORACLE:
        return true_advantages(env, groups.tokens, groups.lengths).float(), []
    choice = estimator if isinstance(estimator, EstimatorChoice) else EstimatorChoice(estimator)
    engine = _engine(choice, env.regime.fork_budget)
    per_call = env.regime.batch_groups * env.regime.group_size
    results = [engine.estimate(groups.batch.select(torch.arange(start, min(start + per_call, groups.batch.size))))
               for start in range(0, groups.batch.size, per_call)]  # the batches of a benchmark run
    return torch.cat([result.advantages for result in results]), results
