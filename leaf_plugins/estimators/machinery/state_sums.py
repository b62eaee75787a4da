"""Sums over the responses that share a token's state, and over those that also share its
action, for every token of the batch at once.

Response ``j``'s token ``t`` is in the *state* ``S(j, t)`` shared by the group's responses
whose tokens ``0 … t−1`` are ``j``'s, and in the *class* ``C(j, t) ⊆ S(j, t)`` of those whose
tokens ``0 … t`` are (the same state and the same action). In the lexicographic order of a
group (``SortedPrefixes``) both are runs of consecutive slots: a partner leaves ``j``'s
class at the position where their tokens first differ (their longest common prefix),
and its state one position later. So each token's two runs come from one scatter of those
positions and one running sum along the tokens (no ``[K, K, T]`` table), and the sum of a
per-token value over a run is the difference of two entries of its running sum over the
group's slots.

Everything is computed in the *sorted layout* ``[G, K, T]`` (group, slot in
lexicographic order, position; ``K`` the largest group, empty slots are zero rows), which
is what the callers reduce per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes

__all__ = ["StateRuns", "state_runs"]


@dataclass(frozen=True)
class StateRuns:
    """Per token, in the sorted layout, the slots ``[start, stop)`` of its class and of
    its state (as rows of a ``[G, K + 1, T]`` running sum over the slots), and the map
    from the batch to that layout."""

    rows: torch.Tensor  # [G, K] int64 batch index of each sorted slot (N for an empty slot)
    bounds: torch.Tensor  # [4, G·K·T] int64 rows of class start, class stop, state start, state stop
    complete: bool  # every slot filled (groups of one size): no empty rows to pad

    def sorted(self, values: torch.Tensor) -> torch.Tensor:
        """``values [N, T, ...]`` in the sorted layout ``[G, K, T, ...]`` (zero rows for
        empty slots)."""
        shape = tuple(self.rows.shape) + tuple(values.shape[1:])
        if not self.complete:
            values = torch.cat([values, values.new_zeros((1,) + tuple(values.shape[1:]))])
        return values.index_select(0, self.rows.reshape(-1)).view(shape)

    def sums(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sums of sorted ``values [G, K, T, Q]`` over every token's class and over its
        state: two ``[G, K, T, Q]`` tensors."""
        groups, slots, width, quantities = values.shape
        running = values.new_zeros((groups, slots + 1, width, quantities))  # [G, K+1, T, Q]: Σ over the slots before
        torch.cumsum(values, dim=1, out=running[:, 1:])
        flat = running.view(-1, quantities)
        ends = flat.index_select(0, self.bounds.view(-1)).view(4, groups, slots, width, quantities)
        return ends[1].sub_(ends[0]), ends[3].sub_(ends[2])


@torch.inference_mode()
def state_runs(batch: RolloutBatch, prefixes: SortedPrefixes, shared: torch.Tensor) -> StateRuns:
    """The runs of every token's class and state (see the module), from the group's
    lexicographic order ``prefixes`` and ``shared [N, K]`` (``shared_prefix_lengths``:
    the tokens each response shares with each sorted slot of its group, the width for
    itself, ``-1`` for an empty slot)."""
    width, slots = batch.width, shared.shape[1]
    rows = prefixes.per_group(prefixes.order, batch.size)  # [G, K]
    own_slot = torch.empty_like(prefixes.slot)
    own_slot[prefixes.order] = prefixes.slot  # [N]: each response's sorted slot
    partner = torch.arange(slots, device=batch.device)  # [K]
    before = partner < own_slot.unsqueeze(1)  # [N, K]
    after = partner > own_slot.unsqueeze(1)
    # a partner leaves the class at its first differing position (an empty slot at 0)
    parting = shared.clamp(min=0, max=width)  # [N, K]
    left = torch.zeros(batch.size, width + 1, dtype=torch.int64, device=batch.device)  # [N, T+1]
    left.scatter_add_(1, parting, before.long())
    right = torch.zeros_like(left).scatter_add_(1, parting, after.long())
    class_start = left[:, :width].cumsum(dim=1)  # [N, T]: partners before the run
    class_stop = slots - right[:, :width].cumsum(dim=1)  # [N, T]
    # the state at t is the class through t − 1; at t = 0 it is the whole group
    state_start = torch.cat([torch.zeros_like(class_start[:, :1]), class_start[:, :-1]], dim=1)
    everyone = batch.groups.sizes.index_select(0, batch.groups.index).unsqueeze(1)  # [N, 1]: the group's slots
    state_stop = torch.cat([everyone, class_stop[:, :-1]], dim=1)
    # rows of the running sum: ((group · (K + 1)) + slot) · T + t
    origin = batch.groups.index.unsqueeze(1) * ((slots + 1) * width) + torch.arange(width, device=batch.device)
    complete = bool((rows < batch.size).all())
    layout = StateRuns(rows, origin, complete)
    bounds = torch.stack([layout.sorted(bound.mul_(width).add_(origin))  # an empty slot reads row 0
                          for bound in (class_start, class_stop, state_start, state_stop)])  # [4, G, K, T]
    return StateRuns(rows, bounds.view(4, -1), complete)
