"""Plugin discovery: the built-ins and the ``leaf_plugins`` entry-point group (and, for
the ``leaf`` console script alone, the ``leaf_plugins.commands`` group).

Entry points are loaded one at a time. A plugin that fails to import, or fails while
registering, is reported with its entry-point name and skipped, unless the environment
variable ``LEAF_PLUGINS_STRICT=1`` is set (for CI), in which case it is fatal.

``get_host()`` loads every plugin; ``get_estimator_host()`` (what ``estimate``, ``Engine``
and the framework integrations use) loads only what estimators need: the built-in
estimators and every third-party plugin, not the built-in backbones, tasks and rewards, so
estimating advantages imports no model code and needs no training stack.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Iterable, Mapping

import pluggy

from leaf_plugins.core.errors import LeafError, PluginLoadError, UnknownNameError
from leaf_plugins.core.hookspecs import ESTIMATOR_STAGES, PROJECT, RUN_HOOKS, LeafSpecs
from leaf_plugins.core.interrupts import received
from leaf_plugins.core.parameters import parameters_problem
from leaf_plugins.core.registry import Entry, Registry

__all__ = ["PluginHost", "LoadedPlugin", "get_host", "get_estimator_host", "discover_commands", "STRICT_ENV",
           "PluginWarning", "KINDS", "COMMAND_GROUP", "BUILTIN_KINDS", "TRAIN_EXTRA", "training_stack_missing",
           "estimator_problems", "EstimatorRegistry"]

STRICT_ENV = "LEAF_PLUGINS_STRICT"
BUILTIN_DISTRIBUTION = "leaf-plugins"
COMMAND_GROUP = f"{PROJECT}.commands"  # entry points whose register_commands adds `leaf` sub-commands

KINDS = ("estimator", "backbone", "task", "reward", "rollout_backend")
DISCOVERY_HOOKS = {  # discovery hook -> the kind it registers
    "register_estimators": "estimator",
    "register_backbones": "backbone",
    "register_tasks": "task",
    "register_rewards": "reward",
    "register_rollout_backends": "rollout_backend",
}
COMMAND_HOOKS = {"register_commands": "command"}
BUILTIN_KINDS = {  # module of a built-in entry point of the `leaf_plugins` group -> the kind it registers
    "leaf_plugins.estimators": "estimator",
    "leaf_plugins.backbones": "backbone",
    "leaf_plugins.tasks": "task",
    "leaf_plugins.rewards": "reward",
    "leaf_plugins.rollout.backends": "rollout_backend",
}
TRAIN_EXTRA = "pip install 'leaf-plugins[train]'"
TRAIN_MODULES = frozenset({"transformers", "peft", "accelerate", "datasets", "sacrebleu", "soundfile", "matplotlib",
                           "tokenizers", "safetensors", "huggingface_hub"})
"""Top-level modules of the ``train`` extra (and theirs): a built-in plugin that cannot import
one of them says to install the extra."""


_ALWAYS_PRESENT = ("tokens", "lengths", "group_ids", "rewards", "vocab_size", "extra")
"""Fields of every ``RolloutBatch`` (``requires`` names only the optional per-token ones)."""


class PluginWarning(UserWarning):
    """A plugin could not be loaded and was skipped."""


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin the host loaded: its entry-point name, the distribution (package) that
    declares it, and the loaded object (usually a module)."""

    name: str
    distribution: str
    plugin: object


@dataclass
class PluginHost:
    """The global plugin manager and the registries its discovery hooks filled."""

    manager: pluggy.PluginManager
    registries: dict[str, Registry[Any]] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)
    loaded: dict[str, LoadedPlugin] = field(default_factory=dict)  # by entry-point (or extra plugin) name

    @property
    def estimators(self) -> Registry[Any]:
        return self.registries["estimator"]

    @property
    def backbones(self) -> Registry[Any]:
        return self.registries["backbone"]

    @property
    def tasks(self) -> Registry[Any]:
        return self.registries["task"]

    @property
    def rewards(self) -> Registry[Any]:
        return self.registries["reward"]

    @property
    def rollout_backends(self) -> Registry[Any]:
        return self.registries["rollout_backend"]

    @classmethod
    def discover(
        cls,
        extra_plugins: Iterable[tuple[str, object]] = (),
        strict: bool | None = None,
        group: str = PROJECT,
        hooks: dict[str, str] | None = None,
    ) -> "PluginHost":
        """Load the built-ins, every entry point of the entry-point ``group`` and
        ``extra_plugins`` (name, plugin) pairs, then run the discovery ``hooks``
        (hook name -> the kind of registry it fills; default: every kind of ``KINDS``).
        Built-in entry points whose kind (``BUILTIN_KINDS``) no hook fills are not loaded;
        a third-party entry point always is (what it registers is known once loaded)."""
        strict = os.environ.get(STRICT_ENV, "") not in ("", "0") if strict is None else strict
        hooks = DISCOVERY_HOOKS if hooks is None else hooks
        manager = pluggy.PluginManager(PROJECT)
        manager.add_hookspecs(LeafSpecs)
        host = cls(manager, {kind: EstimatorRegistry() if kind == "estimator" else Registry(kind.replace("_", " "))
                             for kind in hooks.values()})
        for name, origin, load in _plugin_sources(group, set(hooks.values())):
            host._guard(name, strict, lambda: host._register_plugin(manager, load(), name, origin))
        for name, plugin in extra_plugins:
            host._guard(name, strict, lambda: host._register_plugin(manager, plugin, name, "extra"))
        for hook_name, kind in hooks.items():
            for impl in getattr(manager.hook, hook_name).get_hookimpls():
                registry = host.registries[kind]
                loaded = host.loaded.get(impl.plugin_name)
                origin = loaded.distribution if loaded else impl.plugin_name
                register = host._checked_register(kind, registry, origin, impl.plugin_name, strict)
                host._guard(impl.plugin_name, strict, lambda: impl.function(register=register))
        return host

    def _register_plugin(self, manager: pluggy.PluginManager, plugin: object, name: str, origin: str) -> None:
        manager.register(plugin, name=name)
        manager.check_pending()
        self.loaded[name] = LoadedPlugin(name, origin, plugin)

    def _checked_register(self, kind: str, registry: Registry[Any], origin: str, plugin: str,
                          strict: bool) -> Callable[[str, Any], None]:
        """``register`` of a registry of ``kind``: a value that cannot work (an estimator's
        ``estimator_problems``, any plugin's ``parameters_problem``) is refused, naming it
        and its package; the plugin's other registrations go ahead. Fatal under
        ``strict``, a warning otherwise. The estimator registry remembers why it refused."""

        def register(name: str, value: Any) -> None:
            problems = estimator_problems(value) if kind == "estimator" else []
            if kind not in ("estimator", "command"):
                problems += [problem for problem in [parameters_problem(kind, value)] if problem]
            if not problems or name in registry:  # a second registration of a name: the duplicate error
                registry.add(name, value, origin)
                return
            what = "cannot run" if kind == "estimator" else "cannot be used"
            message = f"{kind.replace('_', ' ')} {name!r} from {origin} {what}: {'; '.join(problems)}"
            if isinstance(registry, EstimatorRegistry):
                registry.refused[name] = message
            if strict:
                raise PluginLoadError(message)
            self._report(plugin, message)

        return register

    def _guard(self, name: str, strict: bool, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # a broken third-party plugin must not take the tool down
            interrupt = received()
            if interrupt is not None:  # Ctrl-C inside its import, wrapped by the library it went through
                raise interrupt from error
            if isinstance(error, LeafError):
                if strict:
                    raise
                self._report(name, str(error))
                return
            message = f"{type(error).__name__}: {error}"
            if training_stack_missing(error) is not None:
                message += f" (the training stack is not installed: {TRAIN_EXTRA})"
            if strict:
                raise PluginLoadError(f"plugin {name!r} failed to load: {message}") from error
            self._report(name, message)

    def _report(self, name: str, message: str) -> None:
        self.failures.append((name, message))
        warnings.warn(
            f"leaf-plugins: skipped plugin {name!r}: {message} (set {STRICT_ENV}=1 to make this fatal)",
            PluginWarning,
            stacklevel=3,
        )


class EstimatorRegistry(Registry[Any]):
    """The estimator registry, which also remembers the estimators it refused: asking for
    one of those gives the reason it cannot run, not "unknown"."""

    def __init__(self) -> None:
        super().__init__("estimator")
        self.refused: dict[str, str] = {}  # name -> why it cannot run

    def entry(self, name: str) -> Entry[Any]:
        """The entry registered under ``name``; a refused estimator raises its reason."""
        if name in self.refused and name not in self:
            raise UnknownNameError(self.refused[name])
        return super().entry(name)


def estimator_problems(estimator: object) -> list[str]:
    """Why ``estimator`` cannot run (empty when it can): it must implement
    ``compute_advantages``; every stage attribute it has must be a ``hookimpl``; it
    implements no other run-time hook (a loss, a rollout, an observer or lifecycle hook:
    those belong to a stage plugin a run config names); its ``parameters`` (optional) is
    a dataclass; its ``requires`` (optional) names per-token fields, for every stage or
    per stage."""
    problems = []
    others = sorted(hook for hook in RUN_HOOKS if getattr(getattr(estimator, hook, None), f"{PROJECT}_impl", None))
    if others:
        problems.append(f"it implements {', '.join(others)}, which an estimator does not (it implements the "
                        f"estimator stages {', '.join(ESTIMATOR_STAGES)} alone): put {'them' if len(others) > 1 else 'it'}"
                        f" in a stage plugin that a run names in plugins:")
    problems += [problem for problem in [parameters_problem("estimator", estimator)] if problem]
    for stage in ESTIMATOR_STAGES:
        impl = getattr(estimator, stage, None)
        if impl is None:
            if stage == "compute_advantages":
                problems.append("it has no compute_advantages stage, which every estimator implements "
                                "(select_boundaries and retain_nodes are optional)")
        elif not callable(impl) or getattr(impl, f"{PROJECT}_impl", None) is None:
            problems.append(f"its {stage} is not a stage hook: make it a method decorated with "
                            f"@leaf_plugins.hookimpl (got {type(impl).__name__})")
    requires = getattr(estimator, "requires", None)
    if requires is not None:
        per_stage = requires.items() if isinstance(requires, Mapping) else [("every stage", requires)]
        for stage, names in per_stage:
            if stage != "every stage" and stage not in ESTIMATOR_STAGES:
                problems.append(f"its requires names an unknown stage {stage!r} "
                                f"(stages: {', '.join(ESTIMATOR_STAGES)})")
            elif isinstance(names, str) or not all(isinstance(n, str) and n.isidentifier() for n in names):
                problems.append(f"its requires ({stage}) must be a tuple of per-token field names, got {names!r}")
            elif any(n in _ALWAYS_PRESENT for n in names):
                problems.append(f"its requires ({stage}) names a field every batch has "
                                f"({', '.join(n for n in names if n in _ALWAYS_PRESENT)}): "
                                "name only optional per-token fields")
    return problems


def training_stack_missing(error: BaseException) -> str | None:
    """What to install, when ``error`` is a module of the ``train`` extra that cannot be
    imported; None for any other error."""
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] in TRAIN_MODULES:
        return f"{error}: this needs the training stack, which is not installed: {TRAIN_EXTRA}"
    return None


def _plugin_sources(group: str = PROJECT, kinds: set[str] | None = None) -> list[tuple[str, str, Callable[[], object]]]:
    """(entry-point name, distribution name, loader) of every plugin of the entry-point
    ``group`` to load: the built-ins first (they are entry points of this package), then
    the others by name. With ``kinds``, a built-in entry point of another kind is left out."""
    declared = list(entry_points(group=group))
    if not any(_distribution(ep) == BUILTIN_DISTRIBUTION for ep in declared):
        raise PluginLoadError(
            "the built-in plugins are not registered: leaf-plugins is not installed in this "
            "environment. Install it (pip install -e . from the source tree)."
        )
    sources: list[tuple[str, str, Callable[[], object]]] = []
    seen: set[tuple[str, str, str]] = set()
    for ep in sorted(declared, key=lambda ep: (_distribution(ep) != BUILTIN_DISTRIBUTION, ep.name)):
        key = (ep.name, ep.value, _distribution(ep))
        builtin_kind = _builtin_kind(ep) if _distribution(ep) == BUILTIN_DISTRIBUTION else None
        if kinds is not None and builtin_kind is not None and builtin_kind not in kinds:
            continue
        if key not in seen:  # the same distribution can be visible twice on sys.path
            seen.add(key)
            sources.append((ep.name, _distribution(ep), ep.load))
    return sources


def _builtin_kind(ep: EntryPoint) -> str | None:
    """The kind a built-in entry point registers (``BUILTIN_KINDS``), None if not listed."""
    module = ep.value.split(":")[0]
    return next((kind for prefix, kind in BUILTIN_KINDS.items() if module == prefix or module.startswith(prefix + ".")),
                None)


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "unknown distribution"


@lru_cache(maxsize=1)
def get_host() -> PluginHost:
    """The process-wide plugin host, discovered on first use."""
    return PluginHost.discover()


def get_estimator_host() -> PluginHost:
    """A host whose estimator registry is the same as ``get_host()``'s: ``get_host()``
    itself once it has been discovered, else a host of the built-in estimators and the
    third-party plugins alone (discovered on first use), which imports no backbone, task
    or training code."""
    if get_host.cache_info().currsize:
        return get_host()
    return _estimators_only()


@lru_cache(maxsize=1)
def _estimators_only() -> PluginHost:
    return PluginHost.discover(hooks={"register_estimators": "estimator"})


def discover_commands(strict: bool | None = None) -> PluginHost:
    """The ``leaf`` sub-commands: a host of the ``leaf_plugins.commands`` entry-point
    group alone, whose ``command`` registry ``register_commands`` filled."""
    return PluginHost.discover(strict=strict, group=COMMAND_GROUP, hooks=COMMAND_HOOKS)
