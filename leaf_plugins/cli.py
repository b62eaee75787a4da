"""The ``leaf`` console script: discovers its sub-commands in ``leaf_plugins.commands``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys
import warnings
from typing import Iterator, Sequence

from leaf_plugins import commands
from leaf_plugins.core.errors import ConfigNotice, LeafError
from leaf_plugins.core.interrupts import exit_status, interrupt_received, interrupts_as_exceptions
from leaf_plugins.core.version import package_version

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command module (a module's optional
    ``EPILOG`` is shown below its options, as written)."""
    parser = argparse.ArgumentParser(prog="leaf", description="Tree-credit RL post-training for speech LLMs.")
    parser.add_argument("--version", action="version", version=f"leaf-plugins {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP,
                                 epilog=getattr(module, "EPILOG", None),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``leaf``. SIGINT (Ctrl-C) and SIGTERM stop a command in order: it
    keeps what is complete, one line on stderr says what, and the exit status is 130
    (SIGINT) or 143 (SIGTERM)."""
    command = ""  # known once the arguments are parsed
    with interrupts_as_exceptions():
        try:
            parser = build_parser()
            args, extra = parser.parse_known_args(argv)
            command = args.command
            if extra and hasattr(args, "overrides") and all("=" in arg and not arg.startswith("-") for arg in extra):
                args.overrides += extra  # overrides after an option: `leaf study FILE --check seeds=[0]`
            elif extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            with _notices_as_notes(command):
                return int(args.run(args) or 0)
        except KeyboardInterrupt as interrupt:
            print(f"{_prefix(command)}: {_interrupted(interrupt)}", file=sys.stderr)
            return exit_status(interrupt)
        except Exception as error:
            interrupt = interrupt_received()
            if interrupt is not None:  # the interrupt, turned into another error by a library it went through
                print(f"{_prefix(command)}: {_interrupted(interrupt)}", file=sys.stderr)
                return exit_status(interrupt)
            if not isinstance(error, LeafError):
                raise
            print(f"{_prefix(command)}: error: {error}", file=sys.stderr)
            return 2


def _prefix(command: str) -> str:
    return f"leaf {command}" if command else "leaf"


def _interrupted(interrupt: KeyboardInterrupt) -> str:
    """The line an interrupted command ends with: the signal and what was kept."""
    name = str(interrupt) or "SIGINT"  # a plain KeyboardInterrupt carries no name
    kept = getattr(interrupt, "kept", None)
    if kept is None:
        return f"interrupted ({name}); nothing new was saved"
    return f"interrupted ({name}); kept {kept}; run the same command to resume"


@contextlib.contextmanager
def _notices_as_notes(command: str) -> Iterator[None]:
    """Print every ``ConfigNotice`` as ``leaf COMMAND: note: ...`` on stderr (other
    warnings as Python shows them)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, ConfigNotice):
            print(f"leaf {command}: note: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", ConfigNotice)
        warnings.showwarning = show
        yield


if __name__ == "__main__":
    sys.exit(main())
