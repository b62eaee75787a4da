"""The plugins a run config enables (``plugins:``): resolved, configured, guarded, recorded.

An entry of ``plugins:`` is a name, or ``{name: NAME, params: {...}}`` for a plugin that
declares parameters. A name is an entry point of the ``leaf_plugins`` group (an installed
package) or an importable module path, optionally ``module.path:Attribute`` (a plugin
that is not packaged). What it names is a module, an object, or a class: a class is
instantiated for the run, with an instance of its ``parameters`` dataclass (built from
``params``, validated like an estimator's parameters) when it declares one, with no
argument otherwise. A module or object takes no parameters.

Such a plugin implements some run-time hooks (``RUN_HOOKS``): it is registered on the
run's plugin manager ahead of the built-in stages, so its ``rollout``, ``score_rollouts``
or ``compute_loss`` replaces theirs (of two named plugins, the one named first wins), and
it alone receives the lifecycle hooks (run start and end, each optimizer step, its state
saved with each checkpoint and restored on resume). An installed plugin that is not
named is never used in a run. Every hook call of a named plugin is guarded: an exception
becomes a ``PluginStageError`` naming the plugin, the hook and the step, which ``leaf``
prints as one line; the run's checkpoints stay as they were, so the same command resumes.

A study varies a named plugin's parameter with the key ``plugins.NAME.PARAM`` (in
``grid``, a variation or an override of ``leaf train`` / ``leaf study``): the run's entry
for plugin ``NAME`` gets ``params.PARAM`` (``plugin_setting``).
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
from typing import Any, Callable, Iterable, Mapping, Sequence

import pluggy
from ruamel.yaml.comments import CommentedMap

from leaf_plugins.core.config import key_location, set_dotted
from leaf_plugins.core.errors import ConfigError, LeafError, suggest
from leaf_plugins.core.hookspecs import ESTIMATOR_STAGES, PROJECT, RUN_HOOKS, LeafSpecs, hookimpls_of
from leaf_plugins.core.parameters import built_parameters, located_parameter_problems, parameters_problem
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.stages import Rollout, RolloutRequest, StepContext

__all__ = ["PLUGINS_RECORD", "StagePlugin", "PluginStageError", "plugin_entry",
           "resolve_plugin", "resolve_plugins", "run_hooks_of", "plugins_validator", "plugin_parameter_problems",
           "plugin_setting", "apply_plugin_settings", "guarded", "call_plugin_hook", "register_stage_plugins",
           "record_plugins", "RolloutStage", "rollout_stage"]

PLUGINS_RECORD = "plugins.json"  # in the run's output directory
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")
_ENTRY_KEYS = ("name", "params")


class PluginStageError(LeafError):
    """A plugin named in the run config raised in one of its hooks."""


@dataclass(frozen=True)
class StagePlugin:
    """A plugin a run config names, resolved (and, a class, instantiated)."""

    name: str  # as the run config names it
    distribution: str | None  # the package it comes from (None: a module outside any installed package)
    version: str | None
    plugin: object  # the module, object or class instance whose hookimpls run
    impls: tuple[tuple[str, str, dict[str, Any]], ...]  # (attribute, hook, hookimpl options) of its run-time hooks
    params: Any = None  # the instance of its parameters dataclass (None: it declares none)

    @property
    def hooks(self) -> list[str]:
        return sorted({hook for _, hook, _ in self.impls})

    def record(self) -> dict[str, Any]:
        """What ``plugins.json`` says of it (its parameters too, when it declares some)."""
        record = {"name": self.name, "distribution": self.distribution, "version": self.version, "hooks": self.hooks}
        if self.params is not None:
            record["params"] = dataclasses.asdict(self.params)
        return record


def plugin_entry(entry: Any) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of an entry of ``plugins:``: a name, or ``{name:, params:}``.

    :raises ConfigError: any other shape, saying what to write."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping):
        unknown = [key for key in entry if key not in _ENTRY_KEYS]
        if unknown:
            raise ConfigError(f"a plugins entry has the keys name and params, got {unknown[0]!r}."
                              f"{suggest(str(unknown[0]), _ENTRY_KEYS)}")
        params = entry.get("params") or {}
        if not isinstance(params, Mapping):
            raise ConfigError(f"plugin {entry.get('name')!r}: params must be a mapping, got {params!r}")
        return entry.get("name"), dict(params)
    raise ConfigError(f"a plugins entry is a name or {{name: NAME, params: {{...}}}}, got {entry!r}")


def resolve_plugins(entries: Sequence[Any], host: PluginHost) -> list[StagePlugin]:
    """Each entry of ``plugins:`` resolved and configured (``resolve_plugin``); a name
    given twice is an error."""
    return [resolve_plugin(name, host, params) for name, params in _entries(entries)]


def _entries(entries: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, params)`` of every entry (``plugin_entry``); a name given twice is an error."""
    named = [plugin_entry(entry) for entry in entries]
    names = [name for name, _ in named]
    repeated = sorted({name for name in names if isinstance(name, str) and names.count(name) > 1})
    if repeated:
        raise ConfigError(f"plugin {repeated[0]!r} is named twice")
    return named


def resolve_plugin(name: str, host: PluginHost, params: Mapping[str, Any] | None = None) -> StagePlugin:
    """The plugin ``name`` names (an installed entry point of the ``leaf_plugins`` group,
    else an importable module or ``module:Attribute``), configured with ``params``.

    :raises ConfigError: not installed and not a module (with a did-you-mean and the
        installed plugins that have run-time hooks), an installed plugin that failed to
        load, a module that raises on import, a plugin with no run-time hook or with an
        estimator stage, or parameters it does not take (every problem at once).
    """
    plugin, distribution = _locate(name, host)
    impls = _run_impls(name, plugin)
    problem = parameters_problem("plugin", plugin)
    if problem:
        raise ConfigError(f"plugin {name!r}: {problem}")
    values = built_parameters("plugin", name, plugin, params)  # None: it declares none
    instance = plugin if values is None else plugin.with_parameters(values)
    if isinstance(instance, type):  # a class without parameters
        instance = instance()
    return StagePlugin(name, distribution, _version(distribution), instance, impls, values)


def _locate(name: Any, host: PluginHost) -> tuple[object, str | None]:
    """What ``name`` names and the package it comes from."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a plugin is named by a non-empty string, got {name!r}")
    failed = dict(host.failures)
    if name in host.loaded:
        loaded = host.loaded[name]
        return loaded.plugin, None if loaded.distribution == "extra" else loaded.distribution
    if name in failed:
        raise ConfigError(f"plugin {name!r} is installed but failed to load: {failed[name]}")
    return _import(name, host), _distribution_of(name)


def _import(name: str, host: PluginHost) -> object:
    """The module ``name`` (or its attribute, for ``module:Attribute``), or the
    ``ConfigError`` of a name that is neither installed nor importable, or of a module
    that fails to import."""
    if _MODULE_PATH.match(name):
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                raise ConfigError(f"plugin module {name!r} failed to import: ModuleNotFoundError: {error}") from None
        except Exception as error:  # the module itself is broken: say how
            raise ConfigError(f"plugin module {name!r} failed to import: {type(error).__name__}: {error}") from None
        else:
            if not attribute:
                return module
            if not hasattr(module, attribute):
                raise ConfigError(f"plugin {name!r}: module {module_name!r} has no attribute {attribute!r}."
                                  f"{suggest(attribute, [a for a in dir(module) if not a.startswith('_')])}")
            return getattr(module, attribute)
    usable = sorted(loaded.name for loaded in host.loaded.values() if run_hooks_of(loaded.plugin))
    raise ConfigError(f"unknown plugin {name!r}: not an installed leaf_plugins entry point nor an importable module."
                      f"{suggest(name, list(host.loaded))} Installed plugins with run-time hooks: "
                      f"{', '.join(usable) or '(none)'}")


def _run_impls(name: str, plugin: object) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """The run-time hook implementations of ``plugin``; an error if it has none or if it
    implements an estimator stage (those come from ``estimator.name`` / ``estimator.stages``)."""
    impls = hookimpls_of(plugin)
    stages = sorted(hook for _, hook, _ in impls if hook in ESTIMATOR_STAGES)
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
    return sorted({hook for _, hook, _ in hookimpls_of(plugin) if hook in RUN_HOOKS})


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
    """A config validator of ``plugins``: every entry has the shape of one and its name
    resolves (the first error); the parameters are ``plugin_parameter_problems``'."""

    def check(entries: Any) -> str | None:
        try:
            for name, _ in _entries(entries):
                _run_impls(name, _locate(name, host)[0])
        except ConfigError as error:
            return str(error)
        return None

    return check


def plugin_parameter_problems(entries: Any, where: str, at: str, host: PluginHost) -> list[tuple[str, str]]:
    """``(location, message)`` of every parameter problem of the ``plugins:`` entries
    ``entries`` (as read from ``where``), each at the key that gave it (or its override);
    entries whose name does not resolve are left to ``plugins_validator``.

    :param at: the location of ``plugins`` itself."""
    problems: list[tuple[str, str]] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping):
            continue
        try:
            name, _ = plugin_entry(entry)
            plugin, _ = _locate(name, host)
        except ConfigError:
            continue
        problems += located_parameter_problems("plugin", name, plugin, entry.get("params"), f"plugins[{name}].params",
                                               where, key_location(entry, "params", at) if "params" in entry else at)
    return problems


def plugin_setting(key: str) -> tuple[str, str] | None:
    """``(plugin name, parameter)`` of a setting ``plugins.NAME.PARAM`` (``NAME`` may
    hold dots: a module path), None for any other key."""
    prefix, _, rest = key.partition(".")
    name, _, parameter = rest.rpartition(".")
    return (name, parameter) if prefix == "plugins" and name and parameter else None


def apply_plugin_settings(data: Any, settings: Iterable[tuple[str, Any, str]], run: str = "") -> list[str]:
    """Set each ``(plugins.NAME.PARAM, value, source)`` setting on the entry of plugin
    ``NAME`` in ``data``'s ``plugins:`` (under the dotted ``run`` path); a name entry
    becomes ``{name:, params:}``. Return the errors, each at its source: a plugin the
    run does not name."""
    errors = []
    section = data
    for part in [p for p in run.split(".") if p]:
        section = section.get(part) if isinstance(section, Mapping) else None
    entries = section.get("plugins") if isinstance(section, Mapping) else None
    for key, value, source in settings:
        name, parameter = plugin_setting(key)
        names = [entry if isinstance(entry, str) else entry.get("name") if isinstance(entry, Mapping) else None
                 for entry in entries or []]
        if name not in names:
            errors.append(f"{source}: {key}: plugin {name!r} is not named in this run's plugins "
                          f"({', '.join(map(str, names)) or 'none'}): name it there to set its parameters."
                          f"{suggest(name, [str(n) for n in names])}")
            continue
        index = names.index(name)
        entry = entries[index]
        if isinstance(entry, str):
            entry = CommentedMap([("name", entry)])
            entries[index] = entry
        params = entry.get("params")
        if not isinstance(params, dict):
            params = CommentedMap()
            entry["params"] = params
        set_dotted(params, parameter, value, source)  # its errors are reported at the setting's source
    return errors


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
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return impl(*args, **kwargs)
        except Exception as error:
            values = {**dict(zip(names, args)), **kwargs}
            context = values.get("context")
            step = context.step if isinstance(context, StepContext) else values.get("step")
            at = f" at step {step}" if isinstance(step, int) else ""
            raise PluginStageError(f"plugin {name!r} failed in its {hook} hook{at}: "
                                   f"{type(error).__name__}: {error}") from error

    return call


def call_plugin_hook(manager: pluggy.PluginManager, plugin: StagePlugin, hook: str, **kwargs: Any) -> list[Any]:
    """Call ``hook`` on the one named ``plugin`` registered on ``manager``
    (``register_stage_plugins``), through pluggy and guarded like its other hooks: the
    list of its results (empty when it does not implement ``hook``). For the hooks whose
    result belongs to one plugin (``save_plugin_state``, ``load_plugin_state``)."""
    own = manager.get_plugin(registered_name(plugin))
    others = [registered for registered in manager.get_plugins() if registered is not own]
    return manager.subset_hook_caller(hook, remove_plugins=others)(**kwargs)


def registered_name(plugin: StagePlugin) -> str:
    """The name under which ``register_stage_plugins`` registers ``plugin``."""
    return f"plugin:{plugin.name}"


def register_stage_plugins(manager: pluggy.PluginManager, plugins: Iterable[StagePlugin]) -> None:
    """Register the guarded ``plugins`` on a run's manager, after its built-in stages and
    in reverse, so that a named plugin is called first and the first named before the
    others (pluggy calls the last registered first)."""
    for plugin in reversed(list(plugins)):
        manager.register(guarded(plugin), name=registered_name(plugin))
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

    def __call__(self, number: int, examples: Sequence[Any], request: RolloutRequest) -> Rollout | None:
        """The plugins' rollout of batch ``number`` (0-based; the context's ``step`` is
        ``number + 1``, 1-based as a training step's), whose run config's ``rollout``
        settings are ``request``'s. None: no plugin sampled it."""
        settings = dataclasses.replace(self.config.rollout, group_size=request.group_size,
                                       max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                                       top_p=request.top_p, surprisal_from=request.surprisal_from)
        context = StepContext(number + 1, request.model, request.loaded, list(examples), request.inputs,
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
