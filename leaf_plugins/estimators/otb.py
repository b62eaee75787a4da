"""OTB: verl's optimal token baseline, a per-token baseline weighted by path variance.

Per group and position t, the baseline is the mean of the returns of the responses
still running at t, each weighted by its cumulative path-variance proxy
``W_{i,t} = Σ_{u<=t} (1 - 2π_{i,u} + Σ_v π_v²)`` (its own return included, as in verl);
the advantage is ``r_i - b_t``. Where fewer than two of the group's responses are still
running (a group of one; the tail of a unique longest response, verl's
``handle_zero_tail``) the baseline is 0. Exact semantics: docs/estimators.md.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.parameters import NoParameters
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.grpo import GRPO
from leaf_plugins.estimators.machinery.path_variance import optimal_token_baselines, real_tokens
from leaf_plugins.estimators.machinery.scratch import scratch

__all__ = ["OTB", "optimal_token_advantages"]


class OTB:
    """Optimal token baseline (verl): r_i minus the path-variance-weighted mean reward of the group, per token."""

    parameters = NoParameters
    requires = {"compute_advantages": ("logprobs", "sum_pi_squared")}  # the path-variance weights

    # no boundaries and root-only nodes: GRPO's stages
    select_boundaries = GRPO.select_boundaries
    retain_nodes = GRPO.retain_nodes

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: NoParameters) -> torch.Tensor:
        return optimal_token_advantages(batch)


def optimal_token_advantages(batch: RolloutBatch) -> torch.Tensor:
    """``[N, T]`` float32 OTB advantages ``r_i - b_{g(i),t}``, exactly 0 on padding.

    Memory is ``O(N·T)`` (no ``[G, K, K, T]`` or per-pair table); the temporaries live in
    two reused scratch buffers.
    """
    with torch.inference_mode():
        baseline = optimal_token_baselines(batch)  # [G, T]
        real = real_tokens(batch)  # [N, T]
        centred = scratch("otb work", tuple(real.shape), torch.float32, real.device)  # [N, T]
        torch.index_select(baseline, 0, batch.groups.index, out=centred)
        torch.sub(batch.rewards.float().unsqueeze(1), centred, out=centred)  # r_i - b_t, padding included
    # (x · 0) is -0.0 for negative x; adding +0.0 makes the padding +0.0
    return torch.mul(centred, real).add_(0.0)


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("otb", OTB())
