"""The estimators the benchmark compares: every registered one, and the exact oracle."""

from __future__ import annotations

from functools import lru_cache

import torch

from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.bench.credit.exact import true_advantages
from leaf_plugins.bench.credit.sampling import Groups
from leaf_plugins.core.engine import Engine
from leaf_plugins.core.plugins import get_host
from leaf_plugins.core.tree import EstimateResult

__all__ = ["ORACLE", "estimator_names", "advantages_of"]

ORACLE = "oracle (true Q-V)"


def estimator_names() -> list[str]:
    """Every registered estimator (third-party ones included), then the oracle."""
    return get_host().estimators.names() + [ORACLE]


@lru_cache(maxsize=64)
def _engine(name: str, fork_budget: int, overrides: tuple[tuple[str, object], ...] = ()) -> Engine:
    accepted = getattr(get_host().estimators.get(name), "parameters", ())
    params = {"fork_budget": fork_budget} if "fork_budget" in accepted else {}
    return Engine(name, {**params, **dict(overrides)})


def advantages_of(name: str, env: Environment, groups: Groups,
                  params: dict[str, object] | None = None) -> tuple[torch.Tensor, list[EstimateResult]]:
    """``[N, H]`` advantages of estimator ``name`` (its default parameters, with the
    regime's fork budget where it has one, and ``params`` over them), called on batches
    of the regime's ``batch_groups`` groups, and the estimate results (none for the
    oracle)."""
    if name == ORACLE:
        return true_advantages(env, groups.tokens, groups.lengths).float(), []
    engine = _engine(name, env.regime.fork_budget, tuple(sorted((params or {}).items())))
    per_call = env.regime.batch_groups * env.regime.group_size
    results = [engine.estimate(groups.batch.select(torch.arange(start, min(start + per_call, groups.batch.size))))
               for start in range(0, groups.batch.size, per_call)]  # the batches of a benchmark run
    return torch.cat([result.advantages for result in results]), results
