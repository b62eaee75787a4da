"""The plugins a run config enables (``plugins: [name, ...]``): resolved, guarded, recorded.

A name is an entry point of the ``leaf_plugins`` group (an installed package) or an
importable module path (a plugin that is not packaged). Such a plugin implements some
run-time hooks (``RUN_HOOKS``): it is registered on the run's plugin manager ahead of the
built-in stages, so its ``rollout``, ``score_rollouts`` or ``compute_loss`` replaces
theirs (of two named plugins, the one named first wins). An installed plugin that is not
named is never used in a run. Every hook call of a named plugin is guarded: an exception
becomes a ``PluginStageError`` naming the plugin, the hook and the step, which ``leaf``
prints as one line; the run's checkpoints stay as they were, so the same command resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pluggy

from leaf_plugins.core.engine import STAGES
from leaf_plugins.core.errors import ConfigError, LeafError, suggest
from leaf_plugins.core.hookspecs import PROJECT, LeafSpecs
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.stages import Rollout, StepContext

__all__ = ["RUN_HOOKS", "PLUGINS_RECORD", "StagePlugin", "PluginStageError", "resolve_plugin",
           "resolve_plugins", "run_hooks_of", "plugins_validator", "guarded", "register_stage_plugins",
           "record_plugins", "RolloutStage", "rollout_stage"]

RUN_HOOKS = ("rollout", "score_rollouts", "compute_loss", "on_step_end", "on_estimate")
PLUGINS_RECORD = "plugins.json"  # in the run's output directory
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginStageError(LeafError):
    """A plugin named in the run config raised in one of its hooks."""


@dataclass(frozen=True)
class StagePlugin:
    """A plugin a run config names, resolved."""

    name: str  # as the run config names it
    distribution: str | None  # the package it comes from (None: a module outside any installed package)
    version: str | None
    plugin: object  # the module or object whose hookimpls run
    impls: tuple[tuple[str, str, dict[str, Any]], ...]  # (attribute, hook, hookimpl options) of its run-time hooks

    @property
    def hooks(self) -> list[str]:
        return sorted({hook for _, hook, _ in self.impls})

    def record(self) -> dict[str, Any]:
        """What ``plugins.json`` says of it."""
        return {"name": self.name, "distribution": self.distribution, "version": self.version, "hooks": self.hooks}


def resolve_plugins(names: Sequence[str], host: PluginHost) -> list[StagePlugin]:
    """Each name resolved (``resolve_plugin``); a name given twice is an error."""
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ConfigError(f"plugin {repeated[0]!r} is named twice")
    return [resolve_plugin(name, host) for name in names]


def resolve_plugin(name: str, host: PluginHost) -> StagePlugin:
    """The plugin ``name`` names: an installed entry point of the ``leaf_plugins`` group,
    else an importable module.

    :raises ConfigError: not installed and not a module (with a did-you-mean and the
        installed plugins that have run-time hooks), an installed plugin that failed to
        load, a module that raises on import, or a plugin with no run-time hook or with
        an estimator stage.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a plugin is named by a non-empty string, got {name!r}")
    failed = dict(host.failures)
    if name in host.loaded:
        loaded = host.loaded[name]
        distribution = None if loaded.distribution == "extra" else loaded.distribution
        plugin: object = loaded.plugin
    elif name in failed:
        raise ConfigError(f"plugin {name!r} is installed but failed to load: {failed[name]}")
    else:
        plugin = _import(name, host)
        distribution = _distribution_of(name)
    impls = _run_impls(name, plugin)
    return StagePlugin(name, distribution, _version(distribution), plugin, impls)


def _import(name: str, host: PluginHost) -> object:
    """The module ``name``, or the ``ConfigError`` of a name that is neither installed nor
    importable, or of a module that fails to import."""
    if _MODULE_PATH.match(name):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not (name == error.name or name.startswith(error.name + ".")):
                raise ConfigError(f"plugin module {name!r} failed to import: ModuleNotFoundError: {error}") from None
        except Exception as error:  # the module itself is broken: say how
            raise ConfigError(f"plugin module {name!r} failed to import: {type(error).__name__}: {error}") from None
    usable = sorted(loaded.name for loaded in host.loaded.values() if run_hooks_of(loaded.plugin))
    raise ConfigError(f"unknown plugin {name!r}: not an installed leaf_plugins entry point nor an importable module."
                      f"{suggest(name, list(host.loaded))} Installed plugins with run-time hooks: "
                      f"{', '.join(usable) or '(none)'}")


def _run_impls(name: str, plugin: object) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """The run-time hook implementations of ``plugin``; an error if it has none or if it
    implements an estimator stage (those come from ``estimator.name`` / ``estimator.stages``)."""
    impls = _hookimpls(plugin)
    stages = sorted(hook for _, hook, _ in impls if hook in STAGES)
    if stages:
        raise ConfigError(f"plugin {name!r} implements the estimator stage {stages[0]!r}: estimator stages come from "
                          f"the run's estimator (estimator.name, estimator.stages), so register it as an estimator")
    run = tuple(impl for impl in impls if impl[1] in RUN_HOOKS)
    if not run:
        raise ConfigError(f"plugin {name!r} implements none of the hooks a run config enables "
                          f"({', '.join(RUN_HOOKS)})")
    return run


def run_hooks_of(plugin: object) -> list[str]:
    """The run-time hooks ``plugin`` implements (those a run config can enable), sorted."""
    return sorted({hook for _, hook, _ in _hookimpls(plugin) if hook in RUN_HOOKS})


def _hookimpls(plugin: object) -> list[tuple[str, str, dict[str, Any]]]:
    """(attribute, hook name, options) of every ``hookimpl`` of ``plugin``."""
    reader = pluggy.PluginManager(PROJECT)
    found = []
    for attribute in dir(plugin):
        try:
            options = reader.parse_hookimpl_opts(plugin, attribute)
        except Exception:  # an attribute that cannot be read is not a hook
            continue
        if options is not None:
            found.append((attribute, options.get("specname") or attribute, dict(options)))
    return found


def _distribution_of(module: str) -> str | None:
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    return names[0] if names else None


def _version(distribution: str | None) -> str | None:
    if distribution is None:
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def plugins_validator(host: PluginHost) -> Callable[[Any], str | None]:
    """A config validator of ``plugins``: every name resolves (the first error)."""

    def check(names: Any) -> str | None:
        try:
            resolve_plugins(list(names), host)
        except ConfigError as error:
            return str(error)
        return None

    return check


def guarded(plugin: StagePlugin) -> object:
    """A plugin object with ``plugin``'s run-time hooks, each raising
    ``PluginStageError`` (naming the plugin, the hook and the step) for any exception of
    the original; hook wrappers are passed on as they are."""
    marker = pluggy.HookimplMarker(PROJECT)
    label = re.sub(r"\W", "_", plugin.name)
    proxy = type(f"plugin_{label}", (), {"__doc__": getattr(plugin.plugin, "__doc__", None)})()
    for attribute, hook, options in plugin.impls:
        impl = getattr(plugin.plugin, attribute)
        wraps = options.get("wrapper") or options.get("hookwrapper")
        setattr(proxy, attribute, impl if wraps else marker(**options)(_reporting(impl, plugin.name, hook)))
    return proxy


def _reporting(impl: Callable[..., Any], name: str, hook: str) -> Callable[..., Any]:
    names = tuple(inspect.signature(impl).parameters)

    @functools.wraps(impl)  # pluggy reads the argument names through the wrapper
    def call(*args: Any) -> Any:
        try:
            return impl(*args)
        except Exception as error:
            values = dict(zip(names, args))
            context = values.get("context")
            step = context.step + 1 if isinstance(context, StepContext) else values.get("step")
            at = f" at step {step}" if isinstance(step, int) else ""
            raise PluginStageError(f"plugin {name!r} failed in its {hook} hook{at}: "
                                   f"{type(error).__name__}: {error}") from error

    return call


def register_stage_plugins(manager: pluggy.PluginManager, plugins: Iterable[StagePlugin]) -> None:
    """Register the guarded ``plugins`` on a run's manager, after its built-in stages and
    in reverse, so that a named plugin is called first and the first named before the
    others (pluggy calls the last registered first)."""
    for plugin in reversed(list(plugins)):
        manager.register(guarded(plugin), name=f"plugin:{plugin.name}")
    manager.check_pending()


def record_plugins(output_dir: Path, plugins: Sequence[StagePlugin], step: int) -> None:
    """Write ``plugins.json`` in the run directory: a list of ``{"from_step", "plugins"}``
    entries, one more whenever the run (re)starts at ``step`` with other plugins than its
    last entry names."""
    from leaf_plugins.training.durable import replace_text

    path = Path(output_dir) / PLUGINS_RECORD
    history = json.loads(path.read_text()) if path.exists() else []
    current = [plugin.record() for plugin in plugins]
    if not history or history[-1]["plugins"] != current:
        history.append({"from_step": step, "plugins": current})
        replace_text(path, json.dumps(history, indent=1))



@dataclass(frozen=True)
class RolloutStage:
    """The ``rollout`` hook of a run's named plugins, for sampling outside training
    (``leaf eval generate``, a study's held-out evaluation): each call is a step whose
    run config carries the evaluation's sampling settings."""

    hook: Any  # the manager's hook caller
    config: Any  # the run's TrainConfig

    def __call__(self, number: int, model: Any, loaded: Any, examples: Sequence[Any], inputs: dict[str, Any],
                 group_size: int, max_new_tokens: int, temperature: float, top_p: float) -> Rollout | None:
        """The plugins' rollout of batch ``number`` (None: no plugin sampled it)."""
        settings = dataclasses.replace(self.config.rollout, group_size=group_size, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p)
        context = StepContext(number, model, loaded, list(examples), inputs,
                              dataclasses.replace(self.config, rollout=settings))
        return self.hook(context=context)


def rollout_stage(config: Any, host: PluginHost) -> RolloutStage | None:
    """The ``rollout`` hook of the plugins ``config.plugins`` names (None when none
    implements it), on a manager of their own."""
    chosen = [plugin for plugin in resolve_plugins(config.plugins, host) if "rollout" in plugin.hooks]
    if not chosen:
        return None
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(LeafSpecs)
    register_stage_plugins(manager, chosen)
    return RolloutStage(manager.hook.rollout, config)
