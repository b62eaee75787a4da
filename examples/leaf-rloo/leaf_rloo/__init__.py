"""RLOO as a leaf-plugins estimator: each response's reward minus the mean reward of the
other responses of its group, broadcast to every token.

This package is a complete third-party plugin: an entry point in the ``leaf_plugins``
group (see ``pyproject.toml``) naming this module, whose ``register_estimators`` hook
registers an object implementing the estimator stage hooks and declaring its
parameters (here none: ``NoParameters``).
"""

from __future__ import annotations

import torch

from leaf_plugins import Boundaries, NoParameters, Nodes, RolloutBatch, hookimpl


class RLOO:
    """RLOO: r_i minus the mean reward of the other responses of the group."""

    parameters = NoParameters  # no parameter of its own (see examples/leaf-tempered for one with a parameter)

    @hookimpl
    def select_boundaries(self, batch: RolloutBatch, params: NoParameters) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)

    @hookimpl
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: NoParameters) -> Nodes:
        layout = batch.groups
        totals = torch.zeros(layout.count, dtype=torch.float64, device=batch.device)
        totals.index_add_(0, layout.index, batch.rewards.double())
        empty = torch.zeros(0, dtype=torch.int64, device=batch.device)
        return Nodes(
            group=empty,
            position=empty,
            value=torch.zeros(0, device=batch.device),
            size=empty,
            path=torch.full((batch.size, 0), -1, dtype=torch.int64, device=batch.device),
            root_value=(totals / layout.sizes).float(),
        )

    @hookimpl
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: NoParameters) -> torch.Tensor:
        layout = batch.groups
        size = layout.sizes[layout.index].double()  # [N]
        total = nodes.root_value.double()[layout.index] * size  # [N]
        others = (total - batch.rewards.double()) / (size - 1).clamp(min=1)  # [N]
        advantage = torch.where(size > 1, batch.rewards.double() - others, 0.0).float()  # [N]
        return torch.where(batch.mask, advantage.unsqueeze(1), 0.0)  # [N, T]


@hookimpl
def register_estimators(register) -> None:  # type: ignore[no-untyped-def]
    register("rloo", RLOO())
