"""The estimators a benchmark compares: ``--estimator NAME[:P=V[,P=V]]`` choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from leaf_plugins.core.config import parse_overrides
from leaf_plugins.core.engine import Engine, parameter_schema
from leaf_plugins.core.errors import ConfigError, LeafError
from leaf_plugins.core.plugins import PluginHost, get_host

__all__ = ["EstimatorChoice", "parse_choice", "estimator_choices", "CHOICE_FORMAT"]

CHOICE_FORMAT = "NAME[:P=V[,P=V]]"


@dataclass(frozen=True)
class EstimatorChoice:
    """A registered estimator at the parameters a user chose (the others at their defaults)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()  # (parameter, value) in the order given

    @property
    def label(self) -> str:
        """How the benchmark's tables name it: ``tree_otb`` or ``tree_otb:ridge=0.1,shrink=auto``."""
        if not self.params:
            return self.name
        return f"{self.name}:" + ",".join(f"{key}={_show(value)}" for key, value in self.params)

    def engine(self, defaults: dict[str, Any] | None = None, host: PluginHost | None = None) -> Engine:
        """Its engine; ``defaults`` (e.g. a benchmark regime's ``fork_budget``) apply
        where the estimator declares them and the choice does not set them."""
        host = host or get_host()
        params = dict(self.params)
        if defaults:
            declared = set(parameter_schema(self.name, host=host).names)
            params = {**{k: v for k, v in defaults.items() if k in declared}, **params}
        return Engine(self.name, params, host=host)


def parse_choice(text: str, host: PluginHost | None = None) -> EstimatorChoice:
    """``NAME[:P=V[,P=V]]`` as a validated choice (values read as YAML scalars: ``0.5``,
    ``auto``, ``true``); a ``ConfigError`` naming the choice and the culprit otherwise."""
    host = host or get_host()
    name, _, rest = text.strip().partition(":")
    settings, errors = parse_overrides(filter(None, (piece.strip() for piece in rest.split(","))))
    if errors:
        raise ConfigError(f"--estimator {text!r} ({CHOICE_FORMAT}): {errors[0]}")
    params = {key.strip(): value for key, value, _ in settings}
    choice = EstimatorChoice(name.strip(), tuple(params.items()))
    try:
        Engine(choice.name, params, host=host)
    except LeafError as error:
        raise ConfigError(f"--estimator {text!r}: {error}") from None
    return choice


def estimator_choices(texts: Iterable[str] | None, host: PluginHost | None = None) -> list[EstimatorChoice]:
    """The choices ``texts`` name (each validated; no label twice), or every registered
    estimator at its defaults when none is named."""
    host = host or get_host()
    texts = list(texts or [])
    if not texts:
        return [EstimatorChoice(name) for name in host.estimators.names()]
    choices = [parse_choice(text, host) for text in texts]
    labels = [choice.label for choice in choices]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"--estimator names {', '.join(map(repr, twice))} more than once")
    return choices


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
