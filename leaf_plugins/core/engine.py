"""The estimation engine: one estimator's stages on a fresh per-run plugin manager."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Iterable, Mapping

import pluggy

from leaf_plugins.core.batch import PER_TOKEN_FIELDS, RolloutBatch
from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.core.finite import check_finite
from leaf_plugins.core.hookspecs import ESTIMATOR_STAGES, OBSERVER_HOOKS, PROJECT, LeafSpecs, hookimpl, hookimpls_of
from leaf_plugins.core.parameters import ParameterSchema
from leaf_plugins.core.plugins import PluginHost, estimator_problems, get_estimator_host
from leaf_plugins.core.tree import Boundaries, EstimateResult, Nodes, root_only_nodes

__all__ = ["Engine", "estimate", "parameter_schema", "declared_requires", "EstimatorDefaults", "observer_view"]


class EstimatorDefaults:
    """The stages an estimator may leave out: no boundaries, and root-only nodes (each
    group's mean reward, no retained node). Registered by the engine for a stage that
    neither the estimator nor a borrowed stage implements."""

    @hookimpl(trylast=True)
    def select_boundaries(self, batch: RolloutBatch, params: Any) -> Boundaries:
        return Boundaries.empty(batch.groups.count, batch.device)  # [G, 0]

    @hookimpl(trylast=True)
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: Any) -> Nodes:
        return root_only_nodes(batch)


def declared_requires(estimator: object) -> dict[str, tuple[str, ...]] | None:
    """The per-token fields each stage of ``estimator`` reads (stage -> field names), from
    its ``requires``: a tuple applies to every stage, a mapping names them per stage (a
    stage it leaves out reads none). None when the estimator does not declare it."""
    requires = getattr(estimator, "requires", None)
    if requires is None:
        return None
    if isinstance(requires, Mapping):
        return {stage: tuple(requires.get(stage, ())) for stage in ESTIMATOR_STAGES}
    return {stage: tuple(requires) for stage in ESTIMATOR_STAGES}


class Engine:
    """A per-run plugin manager holding exactly one estimator, its stage overrides and
    any observers. Build one per run and call ``estimate`` on every batch.

    ``requires`` is what the run's stages read of the batch's optional per-token fields
    (a producer computes these and may skip the others; an estimator that does not declare
    ``requires`` is given every built-in one, ``PER_TOKEN_FIELDS``); ``required_by`` maps
    each field an estimator declared to the estimator and stage that read it: ``estimate``
    refuses a batch without one of them. ``observers`` receive the observer hooks
    (``on_estimate``, ``on_step_end``) and no other: a hook of theirs that could change
    the run is not called, with a warning naming it.
    """

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
        problems = estimator_problems(main)
        if problems:
            raise ConfigError(f"estimator {estimator!r} cannot run: {'; '.join(problems)}")
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
        runs = {stage: (borrowed[stage], host.estimators.get(borrowed[stage])) if stage in borrowed
                else (estimator, main) if hasattr(main, stage) else None
                for stage in ESTIMATOR_STAGES}  # who runs each stage
        if any(provider is None for provider in runs.values()):
            self.manager.register(EstimatorDefaults(), name="defaults")
        self.required_by, self.requires = _requirements(runs)  # field -> (estimator, stage) that declared it
        for index, observer in enumerate(observers):
            self.manager.register(observer_view(observer), name=f"observer:{index}:{type(observer).__name__}")
        self.manager.check_pending()

    def estimate(self, batch: RolloutBatch) -> EstimateResult:
        """Boundaries, nodes and advantages of ``batch`` through the estimator's stages.
        The advantages are always finite: an estimator whose arithmetic overflows raises
        ``NonFiniteError`` naming the response, never returns a NaN."""
        self._check_fields(batch)
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
            raise ConfigError(f"estimator {self.name!r}: every implementation of stage {stage!r} returned None")

    def _check_fields(self, batch: RolloutBatch) -> None:
        """Raise a ConfigError naming the declared per-token fields the batch lacks, the
        estimator and the stage that read them, and how to pass them."""
        missing = [name for name in self.required_by if batch.token_field(name) is None]
        if not missing:
            return
        source, stage = self.required_by[missing[0]]
        missing = [name for name in missing if self.required_by[name] == (source, stage)]  # one stage's at a time
        wanted = [name for name, where in self.required_by.items() if where == (source, stage)]
        builtin = [name for name in wanted if name in PER_TOKEN_FIELDS]
        extra = [name for name in wanted if name not in PER_TOKEN_FIELDS]
        arguments = [f"{name}=..." for name in builtin] + (
            [f"extra={{{', '.join(f'{name!r}: ...' for name in extra)}}}"] if extra else [])
        known = f" (its extra fields: {', '.join(sorted(batch.extra))})" if batch.extra else ""
        fields = "field" if len(missing) == 1 else "fields"
        raise ConfigError(
            f"estimator {source!r} requires the per-token {fields} {' and '.join(repr(n) for n in missing)} (its "
            f"{stage} reads {'it' if len(missing) == 1 else 'them'}), but the batch has no {' and '.join(missing)}"
            f"{known}: pass {'it' if len(missing) == 1 else 'them'} as RolloutBatch.from_lists(..., "
            f"{', '.join(arguments)}) (one value per token; the trainer's rollout records the built-in fields "
            "an estimator requires)")


def _requirements(runs: Mapping[str, tuple[str, object] | None]) -> tuple[dict[str, tuple[str, str]], tuple[str, ...]]:
    """From ``runs`` (stage -> the estimator name and object that runs it, None for the
    default): the declared fields to check (field -> the first estimator and stage that
    read it) and what the run requires: the declared fields, with every built-in field
    for an estimator that declares nothing; built-in fields first, in their order."""
    checks: dict[str, tuple[str, str]] = {}
    undeclared = False
    for stage, provider in runs.items():
        if provider is None:
            continue
        source, estimator = provider
        declared = declared_requires(estimator)
        if declared is None:
            undeclared = True
            continue
        for name in declared[stage]:
            checks.setdefault(name, (source, stage))
    wanted = set(checks) | (set(PER_TOKEN_FIELDS) if undeclared else set())
    ordered = [name for name in PER_TOKEN_FIELDS if name in wanted] + sorted(wanted - set(PER_TOKEN_FIELDS))
    return checks, tuple(ordered)


def observer_view(observer: object) -> object:
    """A plugin object with ``observer``'s observer hooks (``OBSERVER_HOOKS``) and no
    other; a hook it implements besides those is left out with a warning naming it."""
    marker = pluggy.HookimplMarker(PROJECT)
    view = type(f"observer_{type(observer).__name__}", (), {"__doc__": getattr(observer, "__doc__", None)})()
    ignored = []
    for attribute, hook, options in hookimpls_of(observer):
        if hook in OBSERVER_HOOKS:
            setattr(view, attribute, marker(**options)(_forwarding(getattr(observer, attribute))))
        elif not hook.startswith("register_"):
            ignored.append(hook)
    if ignored:
        warnings.warn(f"{type(observer).__name__} observes the run (it was passed in code, not named in the run "
                      f"config's plugins:): it receives {' and '.join(OBSERVER_HOOKS)} alone, and its "
                      f"{', '.join(sorted(ignored))} {'is' if len(ignored) == 1 else 'are'} not called. Name it in "
                      f"plugins: to use {'it' if len(ignored) == 1 else 'them'}", UserWarning, stacklevel=3)
    return view


def _forwarding(method: Any) -> Any:
    """A function calling the bound ``method`` (a hook marker cannot be set on a method);
    pluggy reads the argument names through it."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return call


def _borrowed_stages(stages: Mapping[str, str] | None, host: PluginHost) -> dict[str, str]:
    """``stages`` (stage -> registered estimator) checked: known stages, registered
    estimators that implement them."""
    if stages is not None and not isinstance(stages, Mapping):
        raise ConfigError(f"estimator stages must be a mapping of stage: estimator, got {stages!r}")
    for stage, source in (stages or {}).items():
        if stage not in ESTIMATOR_STAGES:
            raise ConfigError(f"unknown estimator stage {stage!r}.{suggest(str(stage), ESTIMATOR_STAGES)} Stages: {', '.join(ESTIMATOR_STAGES)}")
        if not hasattr(host.estimators.get(source), stage):
            raise ConfigError(f"estimator {source!r} does not implement stage {stage!r} (without it an estimator "
                              "gets the default: no boundaries, root-only nodes): borrow it from one that does")
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
