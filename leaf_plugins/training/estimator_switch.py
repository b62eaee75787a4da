"""Estimator parameters across layers of settings: what a switch of estimator drops,
and each parameter checked where it was given.

The rule (docs/training.md, "Switching the estimator"): parameters belong to the
estimator named in the same place. A *layer* of settings applied over a run config (the
command-line overrides over a run file or a study file; a study's grid cell or
variation over its ``base``) that sets ``estimator.name``, and not ``estimator.params``
or ``estimator`` as a whole, *switches* the estimator. Every parameter given before
that layer which the new estimator (with its stage overrides) does not read, but some
registered estimator does, is then dropped, and all of them are named in one notice
with the place each was given. Everything else is checked against the chosen
estimator: a parameter given in the same layer as the name, and a name that no
registered estimator reads (a misspelling), are errors with a did-you-mean, each
reported where it was given (``file:line:col`` or the override's text).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from leaf_plugins.core.config import Setting, apply_settings, key_location
from leaf_plugins.core.engine import parameter_schema
from leaf_plugins.core.errors import ConfigNotice, LeafError, suggest
from leaf_plugins.core.parameters import parameter_list, parameters_class
from leaf_plugins.core.plugins import PluginHost

__all__ = ["DroppedParams", "apply_layer", "estimator_problems", "dropped_notice", "announce_dropped"]


@dataclass(frozen=True)
class DroppedParams:
    """Parameters left out of a run config because a later layer switched its estimator."""

    estimator: str  # the estimator switched to
    switched_at: str  # where that layer set estimator.name (the override, or file:line:col)
    params: tuple[tuple[str, str], ...]  # (parameter, where it was given), in the order given


def apply_layer(
    data: Any, settings: Sequence[Setting], where: str, host: PluginHost, run: str = ""
) -> tuple[list[str], DroppedParams | None]:
    """Apply one layer of ``(key, value, source)`` settings to ``data`` and drop the
    earlier estimator parameters the layer's estimator does not read (the module's rule).

    :param where: the file ``data`` was read from, for the locations of its keys.
    :param run: the dotted path of the run config in ``data`` (``"base."`` in a study file).
    :returns: the settings' errors, and what was dropped (None when nothing was).
    """
    keys = [key for key, _, _ in settings]
    name_key, params_key = f"{run}estimator.name", f"{run}estimator.params"
    switched_at = next((source for key, _, source in settings if key == name_key), None)
    replaced = {f"{run}estimator", params_key} & set(keys)
    earlier = _params_with_locations(_section(data, f"{run}estimator"), where) if switched_at and not replaced else {}
    errors = apply_settings(data, settings)
    if not earlier:
        return errors, None
    estimator = _section(data, f"{run}estimator")
    try:
        accepted = set(parameter_schema(estimator["name"], estimator.get("stages") or {}, host).names)
    except (LeafError, TypeError, AttributeError):  # an unknown name or bad stages: the config's checks report it
        return errors, None
    readable = _registered_parameters(host)
    in_layer = {key[len(params_key) + 1:].split(".")[0] for key in keys if key.startswith(params_key + ".")}
    dropped = tuple((name, at) for name, at in earlier.items()
                    if name not in accepted and name in readable and name not in in_layer)
    for name, _ in dropped:
        del estimator["params"][name]
    return errors, DroppedParams(str(estimator["name"]), switched_at, dropped) if dropped else None


def dropped_notice(dropped: Iterable[DroppedParams]) -> str | None:
    """One notice naming every dropped parameter, where it was given and the switch
    that left it out; None when nothing was dropped."""
    parts = [f"{one.switched_at} switched the estimator to {one.estimator!r}, which does not read "
             f"{', '.join(f'{name} ({at})' for name, at in one.params)}" for one in dict.fromkeys(dropped)]
    if not parts:
        return None
    return "; ".join(parts) + ": left out (parameters given with estimator.name are kept and checked)"


def announce_dropped(dropped: Iterable[DroppedParams]) -> None:
    """Warn (``ConfigNotice``, shown by ``leaf`` as a ``note:`` line) with the one notice
    of what was dropped, if anything was."""
    notice = dropped_notice(dropped)
    if notice:
        warnings.warn(notice, ConfigNotice, stacklevel=3)


def estimator_problems(section: Any, where: str, host: PluginHost, default_name: str) -> list[tuple[str, str]]:
    """``(location, message)`` of every problem of a run config's ``estimator`` section
    (as read and overridden): its stages, then each parameter at the place that gave it
    (a name the estimator does not declare, a value of the wrong type or one its
    dataclass refuses), then a combination of them its dataclass refuses.

    A name that is not a registered estimator, or ``params`` / ``stages`` that are not
    mappings, are the run config's own type errors (reported by the caller's build):
    nothing more is checked then.

    :param default_name: the estimator a section without ``name`` runs.
    """
    section = section if isinstance(section, Mapping) else {}
    name = section.get("name", default_name)
    params, stages = section.get("params") or {}, section.get("stages") or {}
    if not isinstance(name, str) or name not in host.estimators or not isinstance(params, Mapping) \
            or not isinstance(stages, Mapping):
        return []
    try:
        schema = parameter_schema(name, stages, host)
    except LeafError as error:
        return [(key_location(section, "stages", where), f"estimator.stages: {error}")]
    problems = []
    for problem in schema.problems(dict(params)):
        key = problem.key
        if problem.whole:
            problems.append((key_location(section, "params", where), f"estimator.params: {problem.message}"))
        elif schema.parameter(key) is None:
            problems.append((_param_location(section, key, where), f"estimator.params.{key}: "
                                                                     f"{_not_read(name, key, schema.names, host)}"))
        else:
            problems.append((_param_location(section, key, where), f"estimator.params.{key}: {problem.message}"))
    return problems


def _not_read(name: str, key: Any, accepted: Iterable[str], host: PluginHost) -> str:
    """Why ``key`` is not a parameter of estimator ``name``: whose it is, or a did-you-mean."""
    accepted = sorted(accepted)
    declared = _declared_parameters(host)
    readers = [estimator for estimator, names in declared.items() if key in names]
    everything = sorted({parameter for names in declared.values() for parameter in names})
    hint = (f" (a parameter of {', '.join(readers)})." if readers
            else "." + (suggest(str(key), accepted) or suggest(str(key), everything)))
    return f"estimator {name!r} has no parameter {key!r}{hint} Its parameters: {', '.join(accepted) or '(none)'}"


def _registered_parameters(host: PluginHost) -> frozenset[str]:
    """Every parameter name some registered estimator declares."""
    return frozenset(name for names in _declared_parameters(host).values() for name in names)


def _declared_parameters(host: PluginHost) -> dict[str, frozenset[str]]:
    """Each registered estimator's parameter names (an estimator whose declaration is
    broken declares none here: using it reports why)."""
    declared = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for entry in host.estimators:
            try:
                declared[entry.name] = frozenset(p.name for p in parameter_list(parameters_class(entry.name,
                                                                                                 entry.value)))
            except LeafError:
                declared[entry.name] = frozenset()
    return declared


def _section(data: Any, dotted: str) -> Any:
    """``data[a][b]`` for ``"a.b"``; an empty dict where a part is missing or not a mapping."""
    node = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _params_with_locations(estimator: Any, where: str) -> dict[str, str]:
    """Each parameter of an ``estimator`` section and where it was given."""
    params = estimator.get("params")
    return {key: _param_location(estimator, key, where) for key in params} if isinstance(params, dict) else {}


def _param_location(estimator: Any, key: Any, where: str) -> str:
    """Where parameter ``key`` was given: its own key's location, or, in a mapping given
    whole (``estimator.params={...}``), where that mapping was set."""
    params = estimator.get("params")
    found = key_location(params, key, where) if isinstance(params, dict) else where
    return found if found != where else key_location(estimator, "params", where)
