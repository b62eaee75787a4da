"""Estimator parameters: names, defaults and validation (see the estimator spec)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable

from leaf_plugins.core.errors import ConfigError, suggest

__all__ = ["EstimatorParams", "HORIZONS", "TERMS", "NORMALIZATIONS", "SCALES"]

HORIZONS = ("shortest", "each")
TERMS = ("both", "global", "local")
NORMALIZATIONS = ("none", "span", "token", "batch")
SCALES = ("group_std", "batch_std", "none")


@dataclass(frozen=True)
class EstimatorParams:
    """Every parameter a built-in estimator reads.

    ``fork_budget`` is the paper's B, ``min_group`` its retention threshold m0.
    ``horizon``: ``shortest`` (candidates ``1 <= t < lmin``, the paper) or ``each``
    (``1 <= t < H_i``, the authors' code). ``terms``: ``both`` (GA + LA), ``global``
    (GA only) or ``local`` (LA only). ``normalize``: ``none``, ``span``, ``token`` or
    ``batch``. ``std_floor`` and ``eps`` are GRPO's standard-deviation floor and epsilon.
    ``shrink`` is the prior weight (in responses) that pulls a small node's leave-one-out
    value toward its parent's (``tree_rloo``, ``tree_otb``), or ``"auto"``: learnt per
    group from the other groups' nodes (empirical Bayes, ``node_shrinkage``); ``scale``
    divides their advantages by the group's reward std (``group_std``, as GRPO), by one
    std for the whole batch (``batch_std``: the within-group std pooled over its groups)
    or not at all (``none``);
    ``own_share`` lets ``tree_otb`` weigh the response's own return in its baseline by its
    share of the path-variance weights, as verl's OTB does (biased, lower variance);
    ``prefix_mean`` gives each token of ``tree_otb`` the mean advantage of the responses
    that share its prefix through it (the same batch gradient, less noise per token);
    ``ridge`` is the weight every token adds to its score weight in ``tree_otb``'s κ
    (0: the variance-optimal baseline; larger: closer to the state value);
    ``tree_weight`` is how much of ``tree_otb``'s prefix-tree advantage a token keeps over
    OTB's (``"auto"``: learnt per kind of state from the other groups of the batch; a
    number in ``[0, 1]``: fixed, 1 the tree alone, 0 OTB's baseline alone).
    """

    fork_budget: int = 2
    min_group: int = 2
    horizon: str = "shortest"
    terms: str = "both"
    normalize: str = "span"
    std_floor: float = 0.0
    eps: float = 1e-6
    shrink: float | str = 4.0
    scale: str = "group_std"
    own_share: bool = True
    prefix_mean: bool = False
    ridge: float = 0.0
    tree_weight: float | str = 1.0

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.fork_budget, int) or self.fork_budget < 0:
            problems.append(f"fork_budget must be an integer >= 0, got {self.fork_budget!r}")
        if not isinstance(self.min_group, int) or self.min_group < 2:
            problems.append(f"min_group must be an integer >= 2 (singletons are never nodes), got {self.min_group!r}")
        for name, allowed in (("horizon", HORIZONS), ("terms", TERMS), ("normalize", NORMALIZATIONS), ("scale", SCALES)):
            value = getattr(self, name)
            if value not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}.{suggest(str(value), allowed)}")
        if not isinstance(self.std_floor, (int, float)) or self.std_floor < 0:
            problems.append(f"std_floor must be a number >= 0, got {self.std_floor!r}")
        if not isinstance(self.eps, (int, float)) or self.eps <= 0:
            problems.append(f"eps must be a number > 0, got {self.eps!r}")
        if self.shrink != "auto" and not _finite_non_negative(self.shrink):
            problems.append(f"shrink must be a finite number >= 0 or 'auto', got {self.shrink!r}")
        for name in ("own_share", "prefix_mean"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not _finite_non_negative(self.ridge):
            problems.append(f"ridge must be a finite number >= 0, got {self.ridge!r}")
        if self.tree_weight != "auto" and not (_finite_non_negative(self.tree_weight) and self.tree_weight <= 1):
            problems.append(f"tree_weight must be 'auto' or a number in [0, 1], got {self.tree_weight!r}")
        if problems:
            raise ConfigError("; ".join(problems))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """All parameter names."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def for_estimator(
        cls, estimator: str, accepted: Iterable[str], values: dict[str, Any], defaults: dict[str, Any] | None = None
    ) -> "EstimatorParams":
        """Validate ``values`` for an estimator that reads the ``accepted`` names, over the
        estimator's own ``defaults`` where it has any."""
        accepted = tuple(accepted)
        unknown = [key for key in values if key not in accepted]
        if unknown:
            key = unknown[0]
            raise ConfigError(
                f"estimator {estimator!r} has no parameter {key!r}.{suggest(key, accepted)} "
                f"Its parameters: {', '.join(accepted) or '(none)'}"
            )
        return cls(**{**(defaults or {}), **values})


def _finite_non_negative(value: Any) -> bool:
    """A number (not a bool) in ``[0, inf)``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < float("inf")
