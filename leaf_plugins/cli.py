"""The ``leaf`` console script: its sub-commands are those the ``register_commands`` hook
registers (the built-ins in ``leaf_plugins.commands`` and any package's, through the
``leaf_plugins.commands`` entry-point group)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
import warnings
from typing import Iterator, Sequence

from leaf_plugins.core.errors import ConfigNotice, LeafError, PluginLoadError
from leaf_plugins.core.interrupts import exit_status, interrupt_point, received, stop_on_signals
from leaf_plugins.core.plugins import (
    BUILTIN_DISTRIBUTION, STRICT_ENV, PluginHost, PluginWarning, discover_commands, training_stack_missing,
)
from leaf_plugins.core.processes import launch_rank, note_said, report_failure
from leaf_plugins.core.version import package_version

__all__ = ["main", "script", "build_parser"]


def build_parser(commands: PluginHost | None = None) -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per registered command (a command's
    optional ``epilog`` is shown below its options, as written; the one-line help of a
    command that is not built in names the package it comes from). A command whose
    ``add_arguments`` raises is left out with a warning naming it (fatal with
    ``LEAF_PLUGINS_STRICT=1``); one that needs the uninstalled training stack stays listed and
    says what to install when run."""
    commands = commands or discover_commands()
    parser = argparse.ArgumentParser(prog="leaf", description="Tree-credit RL post-training for speech LLMs.")
    parser.add_argument("--version", action="version", version=f"leaf-plugins {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for entry in commands.registries["command"]:
        try:  # its arguments go to a parser of its own first, so a failure leaves no half-built command
            summary = entry.value.help
            if entry.origin != BUILTIN_DISTRIBUTION:  # a package's command says which package
                summary += f" (from {entry.origin})"
            own = argparse.ArgumentParser(prog=f"{parser.prog} {entry.name}", add_help=False)
            entry.value.add_arguments(own)
            epilog = getattr(entry.value, "epilog", None)
        except Exception as error:  # a broken command plugin must not take the other commands down
            if training_stack_missing(error) is not None:
                _add_unavailable(sub, entry.name, summary, training_stack_missing(error))
                continue
            message = f"command {entry.name!r} of {entry.origin}: add_arguments raised {type(error).__name__}: {error}"
            if os.environ.get(STRICT_ENV, "") not in ("", "0"):
                raise PluginLoadError(message) from error
            warnings.warn(f"leaf-plugins: skipped {message} (set {STRICT_ENV}=1 to make this fatal)", PluginWarning,
                          stacklevel=2)
            continue
        command = sub.add_parser(entry.name, parents=[own], help=summary, description=summary, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        command.set_defaults(run=entry.value.run)
    return parser


def main(argv: Sequence[str] | None = None, restore_signals: bool = True) -> int:
    """Run one ``leaf`` command and return its exit status. SIGINT (Ctrl-C) and SIGTERM
    stop a command in order at its next safe point (``core/interrupts.py``): it keeps
    what is complete, one line on stderr says what, and the exit status is 130 (SIGINT)
    or 143 (SIGTERM); a second signal, seconds after the first, stops it at once. Under
    a launch of several processes the main process alone says it, and an error is said
    once, by the process that had it (``core/processes.py``). The previous signal
    handlers are restored afterwards unless ``restore_signals`` is false (``script``:
    the process exits next, and a signal after the command has finished is ignored)."""
    command = ""  # known once the arguments are parsed
    with stop_on_signals(restore=restore_signals):
        try:
            parser = build_parser()
            interrupt_point()  # a signal during start-up (the imports)
            args, extra = parser.parse_known_args(argv)
            command = args.command
            if extra and hasattr(args, "overrides") and all("=" in arg and not arg.startswith("-") for arg in extra):
                args.overrides += extra  # overrides after an option: `leaf study FILE --check seeds=[0]`
            elif extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            with _notices_as_notes(command):
                return int(args.run(args) or 0)
        except KeyboardInterrupt as interrupt:
            return _stopped(command, interrupt)
        except Exception as error:
            interrupt = received()
            if interrupt is not None:  # the interrupt, turned into another error (a subprocess it ended, a peer)
                return _stopped(command, interrupt)
            return _failed(command, error)


def _stopped(command: str, interrupt: KeyboardInterrupt) -> int:
    """Say (the main process of a launch alone) that the command was interrupted and what
    it kept; the exit status of the signal."""
    rank, world = launch_rank()
    if rank == 0:
        print(f"{_prefix(command)}: {_interrupted(interrupt)}", file=sys.stderr)
        if world > 1:
            note_said()
    return exit_status(interrupt)


def _failed(command: str, error: Exception) -> int:
    """Say what failed (once across a launch: ``processes.report_failure``); 2 for bad
    input (a ``LeafError``, a missing extra), 1 otherwise. On one process an unexpected
    error keeps its Python traceback."""
    missing = training_stack_missing(error)
    known = missing is not None or isinstance(error, LeafError)
    if launch_rank()[1] == 1:
        if not known:
            raise error
        print(f"{_prefix(command)}: error: {missing or error}", file=sys.stderr)
        return 2
    text = (missing or str(error)) if known else "".join(traceback.format_exception(error)).rstrip()
    line = report_failure(error, text)
    if line is not None:
        print(f"{_prefix(command)}: {line}", file=sys.stderr)
    return 2 if known else 1


def _add_unavailable(sub: argparse._SubParsersAction, name: str, help: str, missing: str) -> None:
    """A sub-command whose arguments need the uninstalled training stack: it takes any
    arguments and fails saying what to install."""
    command = sub.add_parser(name, help=f"{help} (not installed: needs the training stack)", description=missing)
    command.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(args: argparse.Namespace) -> int:
        print(f"leaf {name}: error: {missing}", file=sys.stderr)
        return 2

    command.set_defaults(run=run)


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


def script() -> None:
    """The ``leaf`` console script: ``main`` on the command line's arguments, then exit
    with its status; signals stay handled until the process exits."""
    sys.exit(main(restore_signals=False))


if __name__ == "__main__":
    script()
