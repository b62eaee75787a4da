"""``leaf plugins``: every registered estimator, backbone, task and reward, and each
estimator's parameters."""

from __future__ import annotations

import argparse
import warnings

from leaf_plugins.core.errors import LeafError
from leaf_plugins.core.parameters import Parameter, parameter_list, parameters_class
from leaf_plugins.core.plugins import KINDS, get_host

NAME = "plugins"
HELP = ("List every estimator, backbone, task and reward with the package it comes from, and each estimator's "
        "parameters (type, default, help).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=KINDS, help="list only this kind")


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
