"""The built-in sub-commands of the ``leaf`` console script, one module each.

Every module here defines ``NAME``, ``HELP``, ``add_arguments(parser)``, ``run(args) -> int``
and optionally ``EPILOG``. This package is the built-in entry point of the
``leaf_plugins.commands`` group: it registers the modules through ``register_commands``,
as a package adds its own ``leaf`` commands. A command that needs the ``train`` extra calls
``require_training_stack()`` before it loads any plugin; a command that writes files ends
with ``written_line`` of every file it wrote.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path
from typing import Any, Callable, Iterable

from leaf_plugins.core.command import Command
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.plugins import TRAIN_MODULES

__all__ = ["register_commands", "require_training_stack", "written_line"]


@hookimpl
def register_commands(register: Callable[[str, Any], None]) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register(module.NAME, Command.from_module(module))


def require_training_stack() -> None:
    """Raise ``ModuleNotFoundError`` for the first module of the ``train`` extra that is not
    installed (``leaf`` prints it as one line naming the extra and exits with status 2).

    A command that needs the extra calls this before it loads any plugin: with part of the
    training stack installed (verl's environment has transformers but not sacrebleu), the
    built-in rewards and tasks would otherwise be skipped with a warning each and the run
    config rejected for naming a reward or task that is not registered."""
    for module in sorted(TRAIN_MODULES):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a finder that knows the module is absent
            found = False
        if not found:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def written_line(paths: Iterable[Path]) -> str:
    """``written: PATH, PATH, ...``: the line a command prints after writing ``paths``, built
    from the paths the writing code returned or used, so that it names every file written."""
    return "written: " + ", ".join(str(path) for path in paths)
