"""``leaf plugins``: every registered estimator, backbone, task, reward and rollout backend,
and the installed plugins with run-time hooks (which a run config enables in ``plugins:``)."""

from __future__ import annotations

import argparse

from leaf_plugins.core.plugins import KINDS, get_host

NAME = "plugins"
HELP = ("List every estimator, backbone, task, reward and rollout backend, and the stage plugins a run config can "
        "name in plugins:, with the package each comes from.")
STAGE = "stage"  # the kind shown for plugins with run-time hooks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=(*KINDS, STAGE), help="list only this kind")


def run(args: argparse.Namespace) -> int:
    host = get_host()
    rows = [("kind", "name", "from", "description")]
    for kind in KINDS:
        if args.kind and kind != args.kind:
            continue
        for entry in host.registries[kind]:
            doc = (getattr(entry.value, "__doc__", None) or "").strip().splitlines()
            rows.append((kind, entry.name, entry.origin, doc[0] if doc else ""))
    if args.kind in (None, STAGE):
        from leaf_plugins.training.stage_plugins import run_hooks_of

        for loaded in sorted(host.loaded.values(), key=lambda loaded: loaded.name):
            hooks = run_hooks_of(loaded.plugin)
            if hooks:
                rows.append((STAGE, loaded.name, loaded.distribution, f"hooks {', '.join(hooks)}; enable it with "
                             f"plugins: [{loaded.name}] in a run config"))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
    for name, message in host.failures:
        print(f"\nskipped plugin {name!r}: {message}")
    return 0
