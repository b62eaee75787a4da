"""The rollout batch: K responses per prompt, padded into one tensor layout."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch

from leaf_plugins.core.finite import check_finite

__all__ = ["RolloutBatch", "GroupLayout", "PER_TOKEN_FIELDS", "RESERVED_NAMES", "group_sum", "group_mean"]

PAD_TOKEN = -1
"""Token id stored at padding positions. Real token ids are non-negative."""

PER_TOKEN_FIELDS = ("surprisal", "logprobs", "sum_pi_squared")
"""The optional per-token float fields of a batch, ``[N, T]`` each, 0 on padding. Other
per-token fields travel in ``RolloutBatch.extra`` under names of their own."""

RESERVED_NAMES = ("tokens", "lengths", "group_ids", "rewards", *PER_TOKEN_FIELDS, "vocab_size", "extra")
"""Names an extra per-token field may not take: the batch's own fields."""

Derived = TypeVar("Derived")


@dataclass(frozen=True)
class GroupLayout:
    """How the responses of a batch are arranged into groups (one group per prompt).

    Groups are numbered ``0 … G-1`` in ascending order of their ``group_ids``.
    """

    index: torch.Tensor  # [N] int64: group number of each response
    ids: torch.Tensor  # [G] int64: the original group id of each group
    sizes: torch.Tensor  # [G] int64: responses per group (K_g)
    uniform_size: int | None = None  # K when every group has K responses stored contiguously

    @classmethod
    def whole(cls, size: int, device: torch.device | str | None = None) -> "GroupLayout":
        """All ``size`` responses as one group."""
        return cls(
            index=torch.zeros(size, dtype=torch.int64, device=device),
            ids=torch.zeros(1, dtype=torch.int64, device=device),
            sizes=torch.full((1,), size, dtype=torch.int64, device=device),
            uniform_size=size or None,
        )

    @property
    def count(self) -> int:
        """Number of groups G."""
        return int(self.ids.numel())

    @cached_property
    def members(self) -> torch.Tensor:
        """``[G, K_max]`` int64 batch index of each group's responses in batch order,
        ``-1`` padded (a view of ``arange(N)`` when the layout is uniform)."""
        n = int(self.index.numel())
        if self.uniform_size:
            return torch.arange(n, device=self.index.device).view(self.count, self.uniform_size)
        order = torch.argsort(self.index, stable=True)  # [N]
        start = torch.cumsum(self.sizes, 0) - self.sizes  # [G]
        slot = torch.arange(n, device=self.index.device) - start[self.index[order]]  # [N]
        widest = int(self.sizes.max()) if self.count else 0
        members = torch.full((self.count, widest), -1, dtype=torch.int64, device=self.index.device)
        members[self.index[order], slot] = order
        return members


def group_sum(values: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Sum of ``values [N, ...]`` over each group's responses -> ``[G, ...]``."""
    if layout.uniform_size:
        return values.unflatten(0, (layout.count, layout.uniform_size)).sum(dim=1)
    out = torch.zeros((layout.count,) + values.shape[1:], dtype=values.dtype, device=values.device)
    return out.index_add_(0, layout.index, values)


def group_mean(values: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Mean of ``values [N]`` per group -> ``[G]``; 0 for an empty group."""
    if layout.uniform_size:
        return values.view(layout.count, layout.uniform_size).mean(dim=1)
    return group_sum(values, layout) / layout.sizes.clamp(min=1).to(values.dtype)


@dataclass(frozen=True)
class RolloutBatch:
    """A padded batch of sampled responses with their rewards.

    Token positions ``t >= lengths[i]`` are padding: ``tokens`` holds ``-1`` there and
    ``surprisal``/``logprobs``/``sum_pi_squared`` hold 0. Responses of one prompt share a group id; groups
    may differ in size.

    ``extra`` holds further per-token fields by name (``{"value": [N, T] float}``, 0 on
    padding) that a rollout backend, a stage plugin or an adapter adds and an estimator
    declares in its ``requires``; they are checked as the built-in fields are (shape,
    floating dtype, finiteness) and carried by ``to``, ``select`` and ``with_rewards``. All
    tensors live on one device. ``vocab_size``, when the producer knows it, spares the
    estimators a scan for the largest token id.

    Rewards and the per-token fields must be finite: a NaN or an infinity raises
    ``NonFiniteError`` naming the field, the response index, its group id and the token
    (one sum per field on construction, one host synchronisation), so
    no estimator ever sees one.
    """

    tokens: torch.Tensor  # [N, T] int64, -1 on padding
    lengths: torch.Tensor  # [N] int64, H_i >= 0
    group_ids: torch.Tensor  # [N] int64
    rewards: torch.Tensor  # [N] float32
    surprisal: torch.Tensor | None = None  # [N, T] float32: -log pi_old(a_t | x, y_<t)
    logprobs: torch.Tensor | None = None  # [N, T] float32: log pi_old(a_t | x, y_<t)
    sum_pi_squared: torch.Tensor | None = None  # [N, T] float32: sum_v pi_old(v | x, y_<t)^2 (policy distribution)
    vocab_size: int | None = None  # optional bound: every token id is < vocab_size
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)  # name -> [N, T] float, 0 on padding
    _layout: GroupLayout | None = field(default=None, repr=False, compare=False)
    _call_cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", dict(self.extra))  # the batch's own copy
        self._check_shapes()
        fields = {name: getattr(self, name) for name in ("rewards", *PER_TOKEN_FIELDS)}
        fields.update({f"extra[{name!r}]": value for name, value in self.extra.items()})
        check_finite(fields, self.group_ids, "RolloutBatch")
        if self._layout is None:
            object.__setattr__(self, "_layout", _group_layout(self.group_ids))

    def _check_shapes(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"tokens must be [N, T], got shape {tuple(self.tokens.shape)}")
        n, t = self.tokens.shape
        for name in ("lengths", "group_ids", "rewards"):
            value = getattr(self, name)
            if value.shape != (n,):
                raise ValueError(f"{name} must be [N]=[{n}], got shape {tuple(value.shape)}")
        for name in PER_TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and value.shape != (n, t):
                raise ValueError(f"{name} must be [N, T]=[{n}, {t}], got {tuple(value.shape)}")
        for name, value in self.extra.items():
            if not isinstance(name, str) or not name.isidentifier() or name in RESERVED_NAMES:
                raise ValueError(f"extra field names must be identifiers other than the batch's own fields "
                                 f"({', '.join(RESERVED_NAMES)}), got {name!r}")
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise ValueError(f"extra[{name!r}] must be a floating-point tensor [N, T], got "
                                 f"{getattr(value, 'dtype', type(value).__name__)}")
            if value.shape != (n, t):
                raise ValueError(f"extra[{name!r}] must be [N, T]=[{n}, {t}], got {tuple(value.shape)}")
        if n and (int(self.lengths.min()) < 0 or int(self.lengths.max()) > t):
            raise ValueError(f"lengths must lie in [0, T={t}]")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lists(
        cls,
        tokens: Sequence[Sequence[int]],
        rewards: Sequence[float],
        group_ids: Sequence[int],
        surprisal: Sequence[Sequence[float]] | None = None,
        logprobs: Sequence[Sequence[float]] | None = None,
        sum_pi_squared: Sequence[Sequence[float]] | None = None,
        device: torch.device | str | None = None,
        extra: Mapping[str, Sequence[Sequence[float]]] | None = None,
    ) -> "RolloutBatch":
        """Build a batch from ragged Python lists (one list of token ids per response).

        ``surprisal``, ``logprobs`` and ``sum_pi_squared``, when given, must have one
        value per token. ``sum_pi_squared`` is Σ_v π(v | x, y_<t)² of the policy
        distribution the loss differentiates (verl's name; the variance-aware estimators
        ``otb`` and ``tree_otb`` read it). ``extra`` maps the name of a further per-token
        field to its values, one per token as well.
        """
        n = len(tokens)
        if not (len(rewards) == len(group_ids) == n):
            raise ValueError(
                f"tokens, rewards and group_ids must have one entry per response: "
                f"got {n}, {len(rewards)}, {len(group_ids)}"
            )
        lengths = [len(seq) for seq in tokens]
        width = max(lengths, default=0)
        padded = torch.full((n, width), PAD_TOKEN, dtype=torch.int64)
        for i, seq in enumerate(tokens):
            if seq:
                row = torch.as_tensor(list(seq), dtype=torch.int64)
                if int(row.min()) < 0:
                    raise ValueError(f"tokens[{i}] holds a negative token id; ids must be >= 0")
                padded[i, : len(seq)] = row
        return cls(
            tokens=padded.to(device),
            lengths=torch.as_tensor(lengths, dtype=torch.int64, device=device),
            group_ids=torch.as_tensor(list(group_ids), dtype=torch.int64, device=device),
            rewards=torch.as_tensor(list(rewards), dtype=torch.float32, device=device),
            surprisal=_pad_floats(surprisal, lengths, width, "surprisal", device),
            logprobs=_pad_floats(logprobs, lengths, width, "logprobs", device),
            sum_pi_squared=_pad_floats(sum_pi_squared, lengths, width, "sum_pi_squared", device),
            extra={name: _pad_floats(values, lengths, width, f"extra[{name!r}]", device)
                   for name, values in (extra or {}).items()},
        )

    # ------------------------------------------------------------------ views
    @property
    def size(self) -> int:
        """Number of responses N."""
        return int(self.tokens.shape[0])

    @property
    def width(self) -> int:
        """Padded response length T."""
        return int(self.tokens.shape[1])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def token_field(self, name: str) -> torch.Tensor | None:
        """The ``[N, T]`` per-token field ``name``: a built-in one of ``PER_TOKEN_FIELDS``
        or one of ``extra``; None when the batch does not hold it."""
        if name in PER_TOKEN_FIELDS:
            return getattr(self, name)
        return self.extra.get(name)

    @property
    def groups(self) -> GroupLayout:
        """Group numbering of the responses (computed once)."""
        assert self._layout is not None
        return self._layout

    @property
    def token_bound(self) -> int:
        """An upper bound on the token ids (``vocab_size - 1``, or the largest id)."""
        if self.vocab_size is not None:
            return self.vocab_size - 1
        return int(self.tokens.max()) if self.tokens.numel() else 0

    @property
    def mask(self) -> torch.Tensor:
        """``[N, T]`` bool, True on real tokens."""
        positions = torch.arange(self.width, device=self.device)
        return positions.unsqueeze(0) < self.lengths.unsqueeze(1)

    def call_cached(self, key: str, compute: Callable[[], Derived]) -> Derived:
        """``compute()``, computed once per estimator call and ``key``: structure that
        several stages of one call read (the responses' lexicographic order, say) is
        built by the first stage that asks for it. The engine clears the cache when the
        call ends (``clear_call_cache``), so every call pays for what it uses. ``key``
        names what is stored; a plugin should prefix its own keys with its name."""
        if key not in self._call_cache:
            self._call_cache[key] = compute()
        return self._call_cache[key]

    def clear_call_cache(self) -> None:
        """Forget what ``call_cached`` stored."""
        self._call_cache.clear()

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """The same batch on another device."""

        def move(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value.to(device)

        return RolloutBatch(
            tokens=self.tokens.to(device),
            lengths=self.lengths.to(device),
            group_ids=self.group_ids.to(device),
            rewards=self.rewards.to(device),
            surprisal=move(self.surprisal),
            logprobs=move(self.logprobs),
            sum_pi_squared=move(self.sum_pi_squared),
            vocab_size=self.vocab_size,
            extra={name: value.to(device) for name, value in self.extra.items()},
        )

    def with_rewards(self, rewards: torch.Tensor) -> "RolloutBatch":
        """The same responses with other rewards ``[N]``."""
        return replace(self, rewards=rewards.to(self.device, torch.float32))

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of the given response indices ``[M]`` (group ids kept)."""

        def take(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[rows]

        return RolloutBatch(
            tokens=self.tokens[rows],
            lengths=self.lengths[rows],
            group_ids=self.group_ids[rows],
            rewards=self.rewards[rows],
            surprisal=take(self.surprisal),
            logprobs=take(self.logprobs),
            sum_pi_squared=take(self.sum_pi_squared),
            vocab_size=self.vocab_size,
            extra={name: value[rows] for name, value in self.extra.items()},
        )


def _group_layout(group_ids: torch.Tensor) -> GroupLayout:
    ids, index, sizes = torch.unique(group_ids, sorted=True, return_inverse=True, return_counts=True)
    uniform = None
    if sizes.numel() and bool((sizes == sizes[0]).all()):
        size = int(sizes[0])
        if bool((index == torch.arange(index.numel(), device=index.device) // size).all()):
            uniform = size
    return GroupLayout(index=index, ids=ids, sizes=sizes, uniform_size=uniform)


def _pad_floats(
    values: Sequence[Sequence[float]] | None,
    lengths: list[int],
    width: int,
    name: str,
    device: torch.device | str | None,
) -> torch.Tensor | None:
    if values is None:
        return None
    if len(values) != len(lengths):
        raise ValueError(f"{name} must have one entry per response: got {len(values)}, expected {len(lengths)}")
    padded = torch.zeros((len(lengths), width), dtype=torch.float32)
    for i, (row, length) in enumerate(zip(values, lengths)):
        if len(row) != length:
            raise ValueError(f"{name}[{i}] has {len(row)} values for a response of {length} tokens")
        if length:
            padded[i, :length] = torch.as_tensor(list(row), dtype=torch.float32)
    return padded.to(device)
