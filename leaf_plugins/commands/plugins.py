"""``leaf plugins``: every registered estimator (with its parameters), backbone, task,
reward and rollout backend, and the installed plugins with run-time hooks (which a run
config enables in ``plugins:``)."""

from __future__ import annotations

import argparse
import warnings

from leaf_plugins.core.errors import LeafError
from leaf_plugins.core.parameters import Parameter, parameter_list, parameters_class
from leaf_plugins.core.plugins import KINDS, get_host

NAME = "plugins"
HELP = ("List every estimator (with its parameters: type, default, help), backbone, task, reward and rollout "
        "backend, and the stage plugins a run config can name in plugins:, with the package each comes from.")
STAGE = "stage"  # the kind shown for plugins with run-time hooks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=(*KINDS, STAGE), help="list only this kind")


def run(args: argparse.Namespace) -> int:
    host = get_host()
    rows = [("kind", "name", "from", "description")]
    details: dict[int, list[str]] = {}  # row index -> the lines printed below it
    for kind in KINDS:
        if args.kind and kind != args.kind:
            continue
        for entry in host.registries[kind]:
            doc = (getattr(entry.value, "__doc__", None) or "").strip().splitlines()
            rows.append((kind, entry.name, entry.origin, doc[0] if doc else ""))
            if kind == "estimator":
                details[len(rows) - 1] = _parameter_lines(entry.name, entry.value)
    if args.kind in (None, STAGE):
        from leaf_plugins.training.stage_plugins import run_hooks_of

        for loaded in sorted(host.loaded.values(), key=lambda loaded: loaded.name):
            hooks = run_hooks_of(loaded.plugin)
            if hooks:
                rows.append((STAGE, loaded.name, loaded.distribution, f"hooks {', '.join(hooks)}; enable it with "
                             f"plugins: [{loaded.name}] in a run config"))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
        for line in details.get(index, []):
            print("    " + line)
    for name, message in host.failures:
        print(f"\nskipped plugin {name!r}: {message}")
    return 0


def _parameter_lines(name: str, estimator: object) -> list[str]:
    """``name: type = default  help`` per parameter of an estimator (aligned), or why
    its parameters cannot be read."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            parameters: list[Parameter] = parameter_list(parameters_class(name, estimator), name)
    except LeafError as error:
        return [f"parameters: error: {error}"]
    notes = [f"parameters: {warning.message}" for warning in caught if issubclass(warning.category, DeprecationWarning)]
    if not parameters:
        return notes or ["(no parameters)"]
    heads = [f"{p.name}: {p.type_text} = {p.default_text}" for p in parameters]
    width = max(map(len, heads))
    return notes + [f"{head.ljust(width)}  {p.help}".rstrip() for head, p in zip(heads, parameters)]
