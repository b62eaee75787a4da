"""``leaf plugins``: every registered estimator, backbone, task and reward."""

from __future__ import annotations

import argparse

from leaf_plugins.core.plugins import KINDS, get_host

NAME = "plugins"
HELP = "List every estimator, backbone, task and reward with the package it comes from."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=KINDS, help="list only this kind")


def run(args: argparse.Namespace) -> int:
    host = get_host()
    rows = [("kind", "name", "from", "description")]
    for kind in KINDS:
        if args.kind and kind != args.kind:
            continue
        for entry in host.registries[kind]:
            doc = (getattr(entry.value, "__doc__", None) or "").strip().splitlines()
            rows.append((kind, entry.name, entry.origin, doc[0] if doc else ""))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
    for name, message in host.failures:
        print(f"\nskipped plugin {name!r}: {message}")
    return 0
