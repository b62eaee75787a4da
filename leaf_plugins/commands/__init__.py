"""The built-in sub-commands of the ``leaf`` console script, one module each.

Every module here defines ``NAME``, ``HELP``, ``add_arguments(parser)``, ``run(args) -> int``
and optionally ``EPILOG``. This package is the built-in entry point of the
``leaf_plugins.commands`` group: it registers the modules through ``register_commands``,
as a package adds its own ``leaf`` commands.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from leaf_plugins.core.command import Command
from leaf_plugins.core.hookspecs import hookimpl


@hookimpl
def register_commands(register: Callable[[str, Any], None]) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register(module.NAME, Command.from_module(module))
