"""Plugin parameters: every kind of plugin declares its own dataclass; core validates it.

A plugin (an estimator, a reward, a rollout backend, a task, a stage plugin) that takes
parameters exposes ``parameters = SomeParams``, a (preferably frozen) dataclass class.
Its fields are the schema: the type hints say what a value must be, the defaults what
it is when not given, ``field(..., metadata={"help": "..."})`` what it means (``leaf
plugins`` lists all three). ``__post_init__`` may check more (a range, a combination)
and raise ``ValueError`` (or ``ConfigError``) with a message naming the parameter. A
plugin without ``parameters`` takes none (``NoParameters`` says so explicitly).

How a run gets the plugin with its parameters is one protocol: an estimator receives
the instance of its dataclass as ``params`` in every stage call (estimators are
stateless stages); every other kind is built once per run by its own
``with_parameters(params)``, which returns what the run uses (a new instance, or a
function with the parameters bound). ``@parameterised(Params)`` gives a class (built as
``Class(params)``) or a function (called with ``params=...``) both attributes; an
instance may define ``with_parameters`` itself to keep its own state. A plugin that
declares ``parameters`` without ``with_parameters`` is refused when it registers
(``parameters_problem``).

Core checks every value generically against the type hints: ``int`` (not a bool),
``float`` (an int is accepted and converted; NaN is not), ``bool``, ``str``,
``Literal[...]``, ``None``, unions of these (``float | Literal["auto"]``,
``int | None``), ``list[X]``, ``dict``, ``Any``. Each problem names the parameter, what
it must be and what it got; a key no involved plugin declares is refused with a
did-you-mean.

A stage borrowed through ``stages`` (``{"select_boundaries": "collision"}``) receives
an instance of the *borrowed* estimator's own dataclass, filled from the same mapping
with the keys it declares. The keys accepted are those of every involved estimator;
two involved dataclasses that declare one name with different types or defaults are a
``ConfigError`` naming both estimators and the field (the one value could not mean the
same to both).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, TypeVar

from leaf_plugins.core.config import key_location
from leaf_plugins.core.errors import ConfigError, suggest

__all__ = ["NoParameters", "Parameter", "ParameterSchema", "Problem", "parameters_class", "parameter_list",
           "describe_type", "check_value", "declared_parameters", "parameter_problems", "located_parameter_problems",
           "built_parameters", "configured", "parameterised", "parameters_problem"]

Plugin = TypeVar("Plugin")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the parameters given."""

    key: Any  # the parameter at fault, as given (None for a combination, or parameters missing)
    message: str
    whole: bool = False  # about the parameters together, not one of them


@dataclass(frozen=True)
class NoParameters:
    """The parameters of an estimator that has none (``parameters = NoParameters``)."""


@dataclass(frozen=True)
class Parameter:
    """One declared parameter, as ``leaf plugins`` shows it."""

    name: str
    annotation: Any  # the resolved type hint
    default: Any  # dataclasses.MISSING where the parameter must be given
    help: str

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def type_text(self) -> str:
        return describe_type(self.annotation, short=True)

    @property
    def default_text(self) -> str:
        return "(required)" if self.required else _show(self.default)


def parameters_class(name: str, estimator: object) -> type:
    """The parameter dataclass that estimator ``name`` declares as ``parameters``
    (``NoParameters`` when it declares none).

    :raises ConfigError: ``parameters`` is there but not a ``@dataclass`` class."""
    return declared_parameters("estimator", name, estimator) or NoParameters


def parameter_list(cls: type, owner: str = "") -> list[Parameter]:
    """The fields of dataclass ``cls`` as parameters (in declaration order)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception as error:  # a hint naming something the module does not import
        raise ConfigError(f"estimator {owner or cls.__name__!r}: the type hints of {cls.__name__} cannot be "
                          f"resolved ({type(error).__name__}: {error})") from None
    out = []
    for item in dataclasses.fields(cls):
        if not item.init:
            continue
        default = item.default
        if default is dataclasses.MISSING and item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        out.append(Parameter(item.name, hints.get(item.name, Any), default, str(item.metadata.get("help", ""))))
    return out


class ParameterSchema:
    """The parameters of an estimator together with those of the estimators its stages
    are borrowed from: which keys are accepted, and one dataclass instance per owner."""

    def __init__(self, owners: Mapping[str, type], kind: str = "estimator") -> None:
        """:param owners: estimator name -> its parameter dataclass; the first is the main one.
        :param kind: what the owners are, in messages (``estimator``, ``plugin``, ``reward``...)."""
        self.kind = kind
        self.owners = dict(owners)
        self.main = next(iter(self.owners))
        self.declared: dict[str, dict[str, Parameter]] = {
            name: {p.name: p for p in parameter_list(cls, name)} for name, cls in self.owners.items()}
        self._check_agreement()

    @classmethod
    def of(cls, registry: Any, estimator: str, sources: Iterable[str] = ()) -> "ParameterSchema":
        """The schema of ``estimator`` (registered in ``registry``) with the estimators
        its borrowed stages come from (``sources``)."""
        names = list(dict.fromkeys([estimator, *sources]))
        return cls({name: parameters_class(name, registry.get(name)) for name in names})

    @property
    def names(self) -> list[str]:
        """Every accepted parameter name (the main estimator's first)."""
        return list(dict.fromkeys(name for declared in self.declared.values() for name in declared))

    def parameter(self, key: Any) -> Parameter | None:
        """The declaration of ``key`` (None when no involved estimator declares it)."""
        return next((declared[key] for declared in self.declared.values() if key in declared), None)

    def problems(self, values: Mapping[str, Any]) -> list[Problem]:
        """Every problem of ``values``: unknown keys, wrong types, values a dataclass's
        ``__post_init__`` rejects (each key over the defaults), then a combination it
        rejects, and parameters that must be given but were not."""
        problems: list[Problem] = []
        checked: dict[str, Any] = {}
        for key, value in values.items():
            parameter = self.parameter(key) if isinstance(key, str) else None
            if parameter is None:
                problems.append(Problem(key, self.unknown_message(key)))
                continue
            converted, problem = check_value(key, parameter.annotation, value)
            if problem:
                problems.append(Problem(key, problem))
                continue
            rejected = self._rejections({key: converted})
            if rejected:
                problems.append(Problem(key, rejected if key in rejected else f"{key}={value!r}: {rejected}"))
                continue
            checked[key] = converted
        for owner, declared in self.declared.items():
            missing = [p.name for p in declared.values() if p.required and p.name not in values]
            if missing:
                problems.append(Problem(None, f"{self.kind} {owner!r} needs parameter{'s' if len(missing) > 1 else ''} "
                                              f"{', '.join(missing)} ({'; '.join(self._expects(n) for n in missing)})",
                                        whole=True))
        if not problems:
            rejected = self._rejections(checked)
            if rejected:
                problems.append(Problem(None, rejected, whole=True))
        return problems

    def build(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Estimator name -> an instance of its dataclass filled from ``values`` (the keys
        it declares); every problem raised together as one ``ConfigError``."""
        problems = self.problems(values)
        if problems:
            raise ConfigError("; ".join(problem.message for problem in problems))
        return self._instances({key: check_value(key, self.parameter(key).annotation, value)[0]
                                for key, value in values.items()})

    def unknown_message(self, key: Any) -> str:
        """Why ``key`` is refused: a did-you-mean and the parameters there are."""
        names = sorted(self.names)
        return (f"{self.kind} {self.main!r} has no parameter {key!r}.{suggest(str(key), names)} "
                f"Its parameters: {', '.join(names) or '(none)'}")

    def _expects(self, key: str) -> str:
        return f"{key}: {describe_type(self.parameter(key).annotation)}"

    def _instances(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {owner: self.owners[owner](**{k: v for k, v in values.items() if k in declared})
                for owner, declared in self.declared.items()}

    def _rejections(self, values: Mapping[str, Any]) -> str | None:
        """The message of the first dataclass that refuses ``values`` (None if all take them)."""
        for owner, declared in self.declared.items():
            given = {k: v for k, v in values.items() if k in declared}
            if any(p.required and p.name not in given for p in declared.values()):
                continue  # reported as missing
            try:
                self.owners[owner](**given)
            except (ValueError, TypeError) as error:
                return str(error) or f"{self.kind} {owner!r} rejected {given!r} ({type(error).__name__})"
            except Exception as error:  # a bug in a plugin's __post_init__ is still reported, not raised
                return f"{self.kind} {owner!r} failed checking {given!r}: {type(error).__name__}: {error}"
        return None

    def _check_agreement(self) -> None:
        """Two owners that declare one name must declare it alike (type and default)."""
        first: dict[str, tuple[str, Parameter]] = {}
        for owner, declared in self.declared.items():
            for name, parameter in declared.items():
                if name not in first:
                    first[name] = (owner, parameter)
                    continue
                other, earlier = first[name]
                if (earlier.annotation, _key(earlier.default)) != (parameter.annotation, _key(parameter.default)):
                    raise ConfigError(
                        f"estimators {other!r} and {owner!r} both declare parameter {name!r}, differently "
                        f"({other}: {earlier.type_text} = {earlier.default_text}; {owner}: {parameter.type_text} = "
                        f"{parameter.default_text}): a stage borrowed from one cannot share the other's {name!r}")


def declared_parameters(kind: str, name: str, obj: object) -> type | None:
    """The parameter dataclass that ``obj`` (a registered estimator, reward, task, rollout
    backend or a named stage plugin) declares as ``parameters``, or None when it
    declares none.

    :raises ConfigError: ``parameters`` is there but not a ``@dataclass`` class."""
    declared = getattr(obj, "parameters", None)
    if declared is None:
        return None
    if not (isinstance(declared, type) and dataclasses.is_dataclass(declared)):
        raise ConfigError(f"{kind} {name!r}: `parameters` must be a @dataclass class whose fields are its parameters "
                          f"(`@dataclass(frozen=True) class Params: ...`; `parameters = Params`), got {declared!r}")
    return declared


def parameters_problem(kind: str, obj: object) -> str | None:
    """What keeps ``obj``, a plugin of ``kind`` being registered, from being built with
    its parameters (None: nothing): ``parameters`` that is not a dataclass, or, for any
    kind but an estimator, ``parameters`` without a ``with_parameters`` to build it."""
    declared = getattr(obj, "parameters", None)
    if declared is not None and not (isinstance(declared, type) and dataclasses.is_dataclass(declared)):
        return f"`parameters` must be a @dataclass class whose fields are its parameters, got {declared!r}"
    if declared is None or kind == "estimator" or callable(getattr(obj, "with_parameters", None)):
        return None
    return (f"it declares `parameters = {declared.__name__}` but no `with_parameters(params)` to build it: "
            f"decorate it with @parameterised({declared.__name__}) (a class built as Class(params), or a function "
            f"called with params=...), or give it a with_parameters method")


def parameterised(parameters: type) -> Callable[[Plugin], Plugin]:
    """Declare the parameters of a plugin class or function (a reward, a rollout
    backend, a task, a stage plugin): ``parameters`` is the dataclass, and
    ``with_parameters(params)`` builds what a run uses, ``Class(params)`` for a class
    and, for a function, the function with ``params`` bound as a keyword argument.

    ``@parameterised(BonusParams)`` above ``def bonus(predictions, references, params)``
    makes a reward with parameters; above ``class Scorer`` whose ``__init__`` takes the
    ``params`` instance, a class built with them (a ``with_parameters`` the class
    defines itself is kept)."""
    if not (isinstance(parameters, type) and dataclasses.is_dataclass(parameters)):
        raise TypeError(f"parameterised takes a @dataclass class, got {parameters!r}")

    def declare(plugin: Plugin) -> Plugin:
        target: Any = plugin
        target.parameters = parameters
        if isinstance(plugin, type):
            if "with_parameters" not in vars(plugin):
                target.with_parameters = classmethod(lambda cls, params: cls(params))
        else:
            target.with_parameters = lambda params: functools.update_wrapper(
                functools.partial(plugin, params=params), plugin)
        return plugin

    return declare


def parameter_problems(kind: str, name: str, obj: object, values: Mapping[str, Any]) -> list[Problem]:
    """Every problem of ``values`` as the parameters of ``obj`` (``ParameterSchema.problems``);
    each key is one when ``obj`` declares no parameters."""
    declared = declared_parameters(kind, name, obj)
    if declared is None:
        return [Problem(key, f"{kind} {name!r} takes no parameters (it declares no `parameters` dataclass), "
                             f"got {key!r}") for key in values]
    return ParameterSchema({name: declared}, kind).problems(values)


def located_parameter_problems(kind: str, name: str, obj: object, values: Any, path: str, where: str,
                               whole_at: str) -> list[tuple[str, str]]:
    """``(location, message)`` of every problem of ``values`` (a mapping read from a
    config, its keys located with ``key_location``) as the parameters of ``obj``.

    :param path: the dotted config path of ``values`` (``reward_params``), prefixed to
        each message.
    :param where: the file ``values`` was read from.
    :param whole_at: the location of a problem of the parameters together.
    """
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        return [(whole_at, f"{path}: expected a mapping of parameters, got {values!r}")]
    try:
        problems = parameter_problems(kind, name, obj, dict(values))
    except ConfigError as error:
        return [(whole_at, f"{path}: {error}")]
    inner = where if hasattr(values, "lc") else whole_at  # a mapping an override gave whole: at the override
    return [(whole_at if problem.whole else key_location(values, problem.key, inner),
             f"{path}: {problem.message}" if problem.whole else f"{path}.{problem.key}: {problem.message}")
            for problem in problems]


def built_parameters(kind: str, name: str, obj: object, values: Mapping[str, Any] | None = None) -> Any:
    """The instance of ``obj``'s ``parameters`` dataclass built from ``values``, validated
    once (every problem together); None when ``obj`` declares none, and then any value is
    an error.

    :raises ConfigError: every problem of ``values`` at once, naming ``kind`` and ``name``.
    """
    values = dict(values or {})
    declared = declared_parameters(kind, name, obj)
    if declared is None:
        if values:  # each one refused
            raise ConfigError("; ".join(problem.message for problem in parameter_problems(kind, name, obj, values)))
        return None
    return ParameterSchema({name: declared}, kind).build(values)[name]


def configured(kind: str, name: str, obj: object, values: Mapping[str, Any] | None = None) -> Any:
    """What a run uses of the registered (or named) ``obj``, given the parameters
    ``values``: ``obj.with_parameters(params)`` with the instance of its ``parameters``
    dataclass built from ``values`` (defaults included when ``values`` is empty); ``obj``
    itself when it declares none, and then any value is an error.

    :raises ConfigError: every problem of ``values`` at once, naming ``kind`` and ``name``.
    """
    params = built_parameters(kind, name, obj, values)
    if params is None:
        return obj
    build = getattr(obj, "with_parameters", None)
    if not callable(build):
        raise ConfigError(f"{kind} {name!r}: {parameters_problem(kind, obj)}")
    return build(params)


def _key(default: Any) -> Any:
    """A default in a form that compares by value (NaN equal to NaN)."""
    return "nan" if isinstance(default, float) and math.isnan(default) else repr(default)


def check_value(name: str, annotation: Any, value: Any) -> tuple[Any, str | None]:
    """``(value, None)`` with ``value`` converted (an int for a float becomes a float),
    or ``(value, message)`` naming ``name``, what it must be and what it got."""
    ok, converted = _fits(annotation, value)
    if ok:
        return converted, None
    literals = _string_literals(annotation)
    hint = suggest(value, literals) if literals and isinstance(value, str) else ""
    options = _flatten(annotation)
    if options and all(typing.get_origin(o) is Literal and all(isinstance(v, str) for v in typing.get_args(o))
                       for o in options):
        return value, f"{name} must be one of {', '.join(literals)}; got {value!r}.{hint}".removesuffix(".")
    return value, f"{name} must be {describe_type(annotation)}, got {value!r}.{hint}".removesuffix(".")


def _fits(annotation: Any, value: Any) -> tuple[bool, Any]:
    options = _flatten(annotation)
    for option in options:  # an exact match first (an int for ``int | float`` stays an int)
        if _exact(option, value):
            return True, value
    if any(option is float for option in options) and _is_number(value):
        return True, float(value)
    return False, value


def _exact(option: Any, value: Any) -> bool:
    origin = typing.get_origin(option)
    if option is Any:
        return True
    if option is type(None) or option is None:
        return value is None
    if origin is Literal:
        # isinstance, not type equality: a quoted YAML string is a subclass of str
        return any(isinstance(value, type(allowed)) and isinstance(value, bool) == isinstance(allowed, bool)
                   and value == allowed for allowed in typing.get_args(option))
    if option is bool:
        return isinstance(value, bool)
    if option is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if option is float:
        return isinstance(value, float) and not math.isnan(value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(option) if a is not Ellipsis]
        return not args or all(_fits(args[0], item)[0] for item in value)
    if origin is dict or option is dict:
        return isinstance(value, dict)
    if isinstance(option, type):
        return isinstance(value, option)
    return True  # an annotation core cannot check: the dataclass's __post_init__ may


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value))


def _flatten(annotation: Any) -> list[Any]:
    """The options of a union (``Optional`` included), one option otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [part for arg in typing.get_args(annotation) for part in _flatten(arg)]
    return [annotation]


def _string_literals(annotation: Any) -> list[str]:
    return [value for option in _flatten(annotation) if typing.get_origin(option) is Literal
            for value in typing.get_args(option) if isinstance(value, str)]


def describe_type(annotation: Any, short: bool = False) -> str:
    """What a value of ``annotation`` is, in words (``an integer``, ``a number or
    'auto'``) or, with ``short``, as ``leaf plugins`` lists it (``int``, ``float | 'auto'``)."""
    parts = [_describe(option, short) for option in _flatten(annotation)]
    return (" | " if short else " or ").join(dict.fromkeys(parts))


def _describe(option: Any, short: bool) -> str:
    origin = typing.get_origin(option)
    if origin is Literal:
        shown = [_show(value) for value in typing.get_args(option)]
        if short:
            return " | ".join(shown)
        return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)
    if option is type(None) or option is None:
        return "null"
    if option is Any:
        return "any" if short else "any value"
    words = {int: ("int", "an integer"), float: ("float", "a number"), bool: ("bool", "true or false"),
             str: ("str", "a string"), dict: ("dict", "a mapping")}
    if option in words:
        return words[option][0 if short else 1]
    if origin in (list, tuple):
        args = [a for a in typing.get_args(option) if a is not Ellipsis]
        inner = _describe(args[0], short) if args else ""
        return f"list[{inner}]" if short else f"a list{' of ' + inner if inner else ''}"
    if origin is dict:
        return "dict" if short else "a mapping"
    return getattr(option, "__name__", str(option))


def _show(value: Any) -> str:
    """A value as a user writes it in YAML (``'auto'``, ``true``, ``1e-06``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)
