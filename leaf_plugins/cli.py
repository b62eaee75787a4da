"""The ``leaf`` console script: discovers its sub-commands in ``leaf_plugins.commands``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from leaf_plugins import commands
from leaf_plugins.core.errors import LeafError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command module."""
    parser = argparse.ArgumentParser(prog="leaf", description="Tree-credit RL post-training for speech LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``leaf``."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except LeafError as error:
        print(f"leaf {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"leaf {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
