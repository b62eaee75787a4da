"""``leaf plugins``: every registered estimator, backbone, task, reward and rollout
backend (each with its parameters), the installed plugins with run-time hooks (which a
run config enables in ``plugins:``, with theirs), and the ``leaf`` commands."""

from __future__ import annotations

import argparse
import inspect

from leaf_plugins.core.errors import LeafError
from leaf_plugins.core.parameters import Parameter, declared_parameters, parameter_list, parameters_class
from leaf_plugins.core.plugins import KINDS, discover_commands, get_host

NAME = "plugins"
HELP = ("List every estimator, backbone, task, reward and rollout backend (with its parameters: type, default, "
        "help), the stage plugins a run config can name in plugins: (with theirs) and the leaf commands, with the "
        "package each comes from.")
STAGE = "stage"  # the kind shown for plugins with run-time hooks
COMMAND = "command"  # the kind shown for `leaf` sub-commands
PARAMETERS_OF = {"reward": "reward_params", "rollout_backend": "rollout.backend_params", "task": "task.options"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=(*KINDS, STAGE, COMMAND), help="list only this kind")


def run(args: argparse.Namespace) -> int:
    rows = [("kind", "name", "from", "description")]
    details: dict[int, list[str]] = {}  # row index -> the lines printed below it
    failures: list[tuple[str, str]] = []
    if args.kind != COMMAND:
        host = get_host()
        failures += host.failures
        for kind in KINDS:
            if args.kind and kind != args.kind:
                continue
            for entry in host.registries[kind]:
                rows.append((kind, entry.name, entry.origin, description(entry.value)))
                lines = _parameter_lines(kind, entry.name, entry.value)
                if lines:
                    details[len(rows) - 1] = lines
    if args.kind in (None, STAGE):
        from leaf_plugins.training.stage_plugins import run_hooks_of

        for loaded in sorted(host.loaded.values(), key=lambda loaded: loaded.name):
            hooks = run_hooks_of(loaded.plugin)
            if hooks:
                rows.append((STAGE, loaded.name, loaded.distribution, f"hooks {', '.join(hooks)}; enable it with "
                             f"plugins: [{loaded.name}] in a run config"))
                lines = _parameter_lines(STAGE, loaded.name, loaded.plugin)
                if lines:
                    details[len(rows) - 1] = lines
    if args.kind in (None, COMMAND):
        commands = discover_commands()
        failures += [failure for failure in commands.failures if failure not in failures]
        for entry in commands.registries["command"]:
            rows.append((COMMAND, entry.name, entry.origin, str(getattr(entry.value, "help", "") or "")))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
        for line in details.get(index, []):
            print("    " + line)
    for name, message in failures:
        print(f"\nskipped plugin {name!r}: {message}")
    return 0


def description(value: object) -> str:
    """The description ``leaf plugins`` shows for a registered object: the first paragraph
    of its docstring (up to the first blank line), on one line, so that a summary wrapped
    over several lines is shown whole; empty without a docstring."""
    doc = inspect.cleandoc(getattr(value, "__doc__", None) or "")
    return " ".join(doc.split("\n\n")[0].split())


def _parameter_lines(kind: str, name: str, value: object) -> list[str]:
    """``name: type = default  help`` per parameter of an estimator (aligned), or of any
    other registered object or stage plugin that declares a ``parameters`` dataclass;
    or why its parameters cannot be read."""
    if kind == "estimator":
        return _estimator_lines(name, value)
    if kind == "backbone":
        return []
    try:
        declared = declared_parameters(kind, name, value)
        if declared is None:
            return []
        parameters = parameter_list(declared, name)
    except LeafError as error:
        return [f"parameters: error: {error}"]
    where = PARAMETERS_OF.get(kind, f"plugins: [{{name: {name}, params: {{...}}}}]")
    return [f"parameters ({where}):", *_aligned(parameters)] if parameters else []


def _estimator_lines(name: str, estimator: object) -> list[str]:
    try:
        parameters: list[Parameter] = parameter_list(parameters_class(name, estimator), name)
    except LeafError as error:
        return [f"parameters: error: {error}"]
    return _aligned(parameters) if parameters else ["(no parameters)"]


def _aligned(parameters: list[Parameter]) -> list[str]:
    return _columns([(f"{p.name}: {p.type_text} = {p.default_text}", p.help) for p in parameters])


def _columns(rows: list[tuple[str, str]]) -> list[str]:
    """``head  help`` lines, the helps aligned after the longest head."""
    width = max(len(head) for head, _ in rows)
    return [f"{head.ljust(width)}  {help_text}".rstrip() for head, help_text in rows]
