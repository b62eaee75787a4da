"""Each response's positions cut where its path segment or its prefix class changes.

A response's *prefix class* at position ``t`` is the set of its group's responses whose
tokens ``0 … t`` equal its own (itself included). They are in the same state and take
the same action at ``t``, so their tokens there have the same score
``∇ log π(a_t | s_t)``, and the batch gradient only sees the *sum* of their advantages at
``t``. Replacing each by the class mean (``prefix_mean``) keeps every such sum, and so
the gradient, exactly (under a loss that weighs every token of the step alike, as the
trainer's ``token_mean``), and gives the tokens the least squared advantages with those
sums: the part of a token's advantage that only says which continuation its own
response happened to take after ``t`` is averaged over all of the class's
continuations.

The class shrinks as ``t`` grows, at most ``K − 1`` times: where the response stops
sharing its prefix with one of the others (their exact longest common prefix, from the
lexicographic order of ``SortedPrefixes``). Together with the ``D + 1`` starts of its
path segments (``PathBaselines.bounds``) these *events* cut its positions into
intervals on each of which both stay the same, so per-interval values (an ``[N, E + 1]``
table) and one gather per token give every token its class mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.estimators.machinery.prefixes import SortedPrefixes, range_minima

__all__ = ["PathIntervals", "path_intervals", "shared_prefix_lengths"]


@dataclass(frozen=True)
class PathIntervals:
    """Per response, the intervals of positions with one path segment and one class.

    Interval 0 starts at position 0 and interval ``c >= 1`` at ``events[:, c − 1]``; each
    runs to the next start (an interval may be empty). Token ``t`` is in interval
    ``#(events <= t)`` (``token_cells``).
    """

    events: torch.Tensor  # [N, E] int64 sorted positions where an interval starts, at most the width
    segment: torch.Tensor  # [N, E+1] int64 path segment of each interval (D+1: the padding)
    partners: torch.Tensor  # [N, K] int64 batch index of the group's responses (0 where none)
    members: torch.Tensor  # [N, E+1, K] bool: partner k is in the response's class on the interval

    @property
    def count(self) -> int:
        """Intervals per response, ``E + 1``."""
        return self.events.shape[1] + 1

    def token_cells(self, kinds: torch.Tensor, count: int, work: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``[N, T]`` int64 cell ``interval · count + kind`` of every token (``kinds [N, T]``
        int32, each in ``[0, count)``; the interval: the number of events at or before the
        token), written into ``out`` (int64 ``[N, T]``) by way of ``work`` (int32 ``[N, T]``).

        One running sum along each row, of the kinds' steps from token to token plus
        ``count`` at every event: no ``[N, T]`` table of intervals. The sum runs in int64
        (on the CPU 2× faster than an int32 one)."""
        width = kinds.shape[1]
        if width == 0:
            return out
        work[:, :1].copy_(kinds[:, :1])
        torch.sub(kinds[:, 1:], kinds[:, :-1], out=work[:, 1:])  # [N, T]: the kinds' steps
        starts = (self.events < width).to(torch.int32).mul_(count)  # [N, E]: events past the width start nothing
        work.scatter_add_(1, self.events.clamp(max=width - 1), starts)
        return out.copy_(work).cumsum_(dim=1)

    @cached_property
    def _membership(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([N, E+1, K], [N, E+1, 1])`` float64: 1.0 for the partners in each interval's
        class (0.0 for the others), and the class's size (at least 1)."""
        members = self.members.double()
        return members, members.sum(dim=2, keepdim=True).clamp_(min=1)

    def class_means(self, per_response: torch.Tensor) -> torch.Tensor:
        """``[N, E+1, C]`` float64 the mean, over each interval's class, of the members'
        values ``per_response [N, C]`` (float64): one batched product of ``[E+1, K]`` by
        ``[K, C]`` per response, a sum over the members and then a division, so that
        members of one value have exactly that mean."""
        members, sizes = self._membership
        return torch.bmm(members, self._partner_rows(per_response)).div_(sizes)

    def class_means_times(self, per_segment: torch.Tensor, per_member: torch.Tensor) -> torch.Tensor:
        """``[N, E+1, C]`` float64 the mean, over each interval's class, of the members'
        values ``per_segment [N, S]`` (float64) on the interval's path segment (the
        members share the response's tokens up to the interval, so they are on the same
        segment of the same path; clamped to ``S − 1``) times their rows
        ``per_member [N, C]``: one batched product per response, not a
        ``[N, E+1, K, C]`` table."""
        members, sizes = self._membership
        partners = self.partners.shape[1]
        rows = self._partner_rows(per_segment).transpose(1, 2)  # [N, S, K]
        index = self.segment.clamp(max=per_segment.shape[1] - 1).unsqueeze(2).expand(-1, -1, partners)  # [N, E+1, K]
        values = rows.gather(1, index)  # [N, E+1, K]
        return torch.bmm(values.mul_(members), self._partner_rows(per_member)).div_(sizes)

    def _partner_rows(self, per_response: torch.Tensor) -> torch.Tensor:
        """``[N, K, C]`` the rows of ``per_response [N, C]`` of each response's partners."""
        partners = self.partners.shape[1]
        return per_response.index_select(0, self.partners.reshape(-1)).view(-1, partners, per_response.shape[1])


@torch.inference_mode()
def shared_prefix_lengths(batch: RolloutBatch,
                          prefixes: SortedPrefixes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``([N, K] int64, [N, K] int64)``: for response ``i`` and slot ``k`` of its group
    (in the lexicographic order ``prefixes``, found here if not given), the number of
    leading tokens ``i`` shares with that slot's response (the width for itself and for
    an identical response, ``-1`` for an empty slot), and that response's batch index (0
    for an empty slot). Exact: from the adjacent LCPs of the lexicographic order, whose
    pairwise minima are every pair's LCP."""
    prefixes = SortedPrefixes.lexicographic(batch) if prefixes is None else prefixes
    width, slots = batch.width, prefixes.max_size
    spans = range_minima(prefixes.gap_matrix)  # [G, K-1(a), K-1(k)]: LCP of sorted slots a and k+1, a <= k
    groups = prefixes.groups
    pairwise = torch.full((groups, slots, slots), width, dtype=torch.int64, device=batch.device)  # [G, K, K]
    if slots > 1:
        upper = pairwise[:, :-1, 1:]  # [G, K-1, K-1]: slot a against slot k+1
        upper.copy_(torch.where(spans >= 0, spans, upper))
        lower = pairwise.transpose(1, 2)[:, :-1, 1:]  # the same pairs, seen from the later slot
        lower.copy_(torch.where(spans >= 0, spans, lower))
    sizes = prefixes.sizes.view(-1, 1)  # [G, 1]
    empty = torch.arange(slots, device=batch.device) >= sizes  # [G, K]
    pairwise.masked_fill_(empty.unsqueeze(1), -1)
    shared = torch.empty((batch.size, slots), dtype=torch.int64, device=batch.device)
    shared[prefixes.order] = pairwise[prefixes.group, prefixes.slot]  # [N, K] in batch order
    partners = prefixes.per_group(prefixes.order, 0)[batch.groups.index]  # [N, K]
    return shared, partners


@torch.inference_mode()
def path_intervals(batch: RolloutBatch, bounds: torch.Tensor,
                   shared_prefixes: tuple[torch.Tensor, torch.Tensor] | None) -> PathIntervals:
    """The intervals of every response's positions (see the module) from its path
    segments' ``bounds [N, D+2]`` (``PathBaselines``) and, with ``shared_prefixes`` (the
    pair of ``shared_prefix_lengths``), the positions where its prefix class shrinks.
    Without them every class is the response alone and the intervals are the path
    segments."""
    width = batch.width
    starts_of_segments = bounds[:, 1:]  # [N, D+1]: the path's nodes, then the padding
    if shared_prefixes is not None:
        shared, partners = shared_prefixes  # [N, K] each
    else:
        shared = torch.full((batch.size, 1), width, dtype=torch.int64, device=batch.device)
        partners = torch.arange(batch.size, device=batch.device).unsqueeze(1)
    partings = torch.where(shared >= 0, shared, width)  # [N, K]: an empty slot parts nowhere
    events = torch.cat([starts_of_segments, partings], dim=1).clamp_(max=width)  # [N, E]
    events = events.sort(dim=1).values
    starts = torch.cat([torch.zeros_like(events[:, :1]), events], dim=1)  # [N, E+1]
    segment = (starts_of_segments.unsqueeze(1) <= starts.unsqueeze(2)).sum(dim=2)  # [N, E+1]
    members = shared.unsqueeze(1) > starts.unsqueeze(2)  # [N, E+1, K]: still sharing at the start
    return PathIntervals(events, segment, partners, members)
