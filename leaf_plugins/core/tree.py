"""What the estimator stages hand to each other: boundaries, nodes and the result."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from leaf_plugins.core.batch import RolloutBatch, group_mean

__all__ = ["Boundaries", "Nodes", "Node", "EstimateResult", "ascending_used_first", "root_only_nodes"]


def ascending_used_first(positions: torch.Tensor) -> torch.Tensor:
    """``positions [G, B]`` sorted ascending with the unused entries (``<= 0``) last, as ``-1``."""
    unused = torch.iinfo(torch.int64).max
    ordered = torch.where(positions > 0, positions, unused).sort(dim=1).values
    return torch.where(ordered == unused, -1, ordered)


@dataclass(frozen=True)
class Boundaries:
    """The selected prefix boundaries of every group.

    Built from ``[G, B]`` positions in any order, where entries ``<= 0`` are unused; it
    keeps them ascending per group with the unused entries last, as ``-1``, which is
    the form every node-retention stage reads.
    """

    positions: torch.Tensor  # [G, B] int64, ascending per row, -1 where unused

    def __post_init__(self) -> None:
        if self.positions.numel():
            object.__setattr__(self, "positions", ascending_used_first(self.positions))

    @classmethod
    def empty(cls, groups: int, device: torch.device) -> "Boundaries":
        """No boundary in any of ``groups`` groups."""
        return cls(torch.full((groups, 0), -1, dtype=torch.int64, device=device))

    def to_lists(self) -> list[list[int]]:
        """Per group, the selected positions in ascending order."""
        return [[p for p in row if p >= 0] for row in self.positions.tolist()]


@dataclass(frozen=True)
class Node:
    """A retained prefix node: responses ``members`` share their first ``position`` tokens."""

    position: int
    members: tuple[int, ...]
    value: float


@dataclass(frozen=True)
class Nodes:
    """Retained prefix nodes of a batch, and each response's path through them.

    Response ``i`` passes through nodes ``path[i, 0], path[i, 1], …`` in ascending order
    of position; ``-1`` ends the path. The root (empty prefix, value ``root_value``) is
    implicit and never listed.
    """

    group: torch.Tensor  # [M] int64: group number of each node
    position: torch.Tensor  # [M] int64: prefix length p(v)
    value: torch.Tensor  # [M] float32: mean reward of the members V(v)
    size: torch.Tensor  # [M] int64: number of members n(v)
    path: torch.Tensor  # [N, D] int64: node indices per response, -1 padded
    root_value: torch.Tensor  # [G] float32: mean reward of the group V0

    @property
    def count(self) -> int:
        """Number of retained nodes M."""
        return int(self.position.numel())

    def to_lists(self) -> list[list[Node]]:
        """Per group, its nodes ordered by (position, first member)."""
        groups = int(self.root_value.numel())
        members: dict[int, list[int]] = {}
        rows, cols = torch.nonzero(self.path >= 0, as_tuple=True)
        for response, node in zip(rows.tolist(), self.path[rows, cols].tolist()):
            members.setdefault(node, []).append(response)
        per_group: list[list[Node]] = [[] for _ in range(groups)]
        for index, (group, position, value) in enumerate(
            zip(self.group.tolist(), self.position.tolist(), self.value.tolist())
        ):
            per_group[group].append(Node(position, tuple(sorted(members.get(index, []))), value))
        for nodes in per_group:
            nodes.sort(key=lambda node: (node.position, node.members))
        return per_group


@torch.inference_mode()
def root_only_nodes(batch: RolloutBatch) -> Nodes:
    """No retained node, only the root of every group: its mean reward ``V0``. What an
    estimator without a ``retain_nodes`` stage receives in ``compute_advantages``."""
    device = batch.device
    means = group_mean(batch.rewards.double(), batch.groups)  # [G]
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return Nodes(
        group=empty,
        position=empty,
        value=torch.zeros(0, dtype=torch.float32, device=device),
        size=empty,
        path=torch.full((batch.size, 0), -1, dtype=torch.int64, device=device),
        root_value=means.float(),
    )


@dataclass(frozen=True)
class EstimateResult:
    """Advantages of a batch with the boundaries and nodes they were computed from.

    ``boundaries`` and ``nodes`` are per-group Python lists (groups in ascending order of
    group id), built on first access; ``boundary_table`` and ``node_table`` are the
    tensors the stages exchanged.
    """

    advantages: torch.Tensor  # [N, T] float32, exactly 0 on padding
    boundary_table: Boundaries
    node_table: Nodes
    estimator: str

    @cached_property
    def boundaries(self) -> list[list[int]]:
        return self.boundary_table.to_lists()

    @cached_property
    def nodes(self) -> list[list[Node]]:
        return self.node_table.to_lists()

