"""The estimation engine: one estimator's stages on a fresh per-run plugin manager."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Iterable, Mapping

import pluggy

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.core.finite import check_finite
from leaf_plugins.core.hookspecs import PROJECT, LeafSpecs
from leaf_plugins.core.parameters import ParameterSchema
from leaf_plugins.core.plugins import PluginHost, get_estimator_host
from leaf_plugins.core.tree import EstimateResult

__all__ = ["Engine", "estimate", "parameter_schema", "STAGES"]

STAGES = ("select_boundaries", "retain_nodes", "compute_advantages")


class Engine:
    """A per-run plugin manager holding exactly one estimator, its stage overrides and
    any observers. Build one per run and call ``estimate`` on every batch."""

    def __init__(
        self,
        estimator: str = "leaf",
        params: Mapping[str, Any] | None = None,
        stages: Mapping[str, str] | None = None,
        observers: Iterable[object] = (),
        host: PluginHost | None = None,
    ) -> None:
        host = host or get_estimator_host()
        self.name = estimator
        main = host.estimators.get(estimator)
        borrowed = _borrowed_stages(stages, host)
        schema = ParameterSchema.of(host.estimators, estimator, borrowed.values())
        instances = schema.build(dict(params or {}))
        self.params = instances[estimator]  # an instance of the estimator's own parameter dataclass
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(LeafSpecs)
        self.manager.register(main, name=f"estimator:{estimator}")
        for stage, source in borrowed.items():
            override = _stage_override(stage, host.estimators.get(source), instances[source])
            self.manager.register(override, name=f"stage:{stage}:{source}")
        for index, observer in enumerate(observers):
            self.manager.register(observer, name=f"observer:{index}:{type(observer).__name__}")
        self.manager.check_pending()

    def estimate(self, batch: RolloutBatch) -> EstimateResult:
        """Boundaries, nodes and advantages of ``batch`` through the estimator's stages.
        The advantages are always finite: an estimator whose arithmetic overflows raises
        ``NonFiniteError`` naming the response, never returns a NaN."""
        hook = self.manager.hook
        try:
            boundaries = hook.select_boundaries(batch=batch, params=self.params)
            self._require(boundaries, "select_boundaries")
            nodes = hook.retain_nodes(batch=batch, boundaries=boundaries, params=self.params)
            self._require(nodes, "retain_nodes")
            advantages = hook.compute_advantages(batch=batch, nodes=nodes, params=self.params)
            self._require(advantages, "compute_advantages")
        finally:
            batch.clear_call_cache()  # what the stages shared lives for this call only
        check_finite({"advantages": advantages}, batch.group_ids, f"estimator {self.name!r}",
                     "The batch is finite, so the estimator overflowed: rescale the rewards (|r| well below 1e38)")
        result = EstimateResult(advantages, boundaries, nodes, self.name)
        hook.on_estimate(batch=batch, result=result)
        return result

    def _require(self, value: object, stage: str) -> None:
        if value is None:
            raise ConfigError(f"estimator {self.name!r} has no implementation of stage {stage!r}")


def _borrowed_stages(stages: Mapping[str, str] | None, host: PluginHost) -> dict[str, str]:
    """``stages`` (stage -> registered estimator) checked: known stages, registered
    estimators that implement them."""
    if stages is not None and not isinstance(stages, Mapping):
        raise ConfigError(f"estimator stages must be a mapping of stage: estimator, got {stages!r}")
    for stage, source in (stages or {}).items():
        if stage not in STAGES:
            raise ConfigError(f"unknown estimator stage {stage!r}.{suggest(str(stage), STAGES)} Stages: {', '.join(STAGES)}")
        if not hasattr(host.estimators.get(source), stage):
            raise ConfigError(f"estimator {source!r} does not implement stage {stage!r}")
    return dict(stages or {})


def parameter_schema(
    estimator: str, stages: Mapping[str, str] | None = None, host: PluginHost | None = None
) -> ParameterSchema:
    """The parameters an estimator accepts: its own dataclass's, with those of the
    estimators its borrowed stages come from (``stages``: stage -> registered estimator)."""
    host = host or get_estimator_host()
    return ParameterSchema.of(host.estimators, estimator, _borrowed_stages(stages, host).values())


def _stage_override(stage: str, estimator: object, params: object) -> object:
    """A plugin whose only hook is ``stage``, forwarded to ``estimator`` with ``params``
    (an instance of that estimator's own parameter dataclass) and called before the main
    estimator's own implementation of that stage."""
    impl = getattr(estimator, stage)
    names = list(inspect.signature(impl).parameters)  # the order pluggy passes the arguments in
    slot = names.index("params") if "params" in names else None

    @functools.wraps(impl)  # pluggy reads the argument names through the wrapper
    def forward(*args: Any) -> Any:
        if slot is not None:
            args = (*args[:slot], params, *args[slot + 1:])
        return impl(*args)

    plugin = type(f"{stage}_from_{type(estimator).__name__}", (), {})()
    setattr(plugin, stage, pluggy.HookimplMarker(PROJECT)(tryfirst=True)(forward))
    return plugin


def estimate(
    batch: RolloutBatch,
    estimator: str = "leaf",
    stages: Mapping[str, str] | None = None,
    **params: Any,
) -> EstimateResult:
    """Per-token advantages of ``batch`` with a registered estimator.

    :param batch: the rollout batch (``RolloutBatch.from_lists`` builds one from lists).
    :param estimator: a registered estimator name: ``grpo``, ``leaf``, ``collision``,
        ``full_tree`` or a third-party one (``leaf plugins`` lists them).
    :param stages: optional stage overrides, e.g. ``{"select_boundaries": "collision"}``.
    :param params: the estimator's parameters, the fields of its ``parameters``
        dataclass (``leaf plugins`` lists them; docs/estimators.md has the built-ins').
    """
    return Engine(estimator, params, stages).estimate(batch)
