"""A sub-command of the ``leaf`` console script, as ``register_commands`` registers it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """``leaf NAME``: its one-line help, how it adds its arguments, and what it runs."""

    help: str  # shown by `leaf --help` and as the description of `leaf NAME --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], "int | None"]  # the exit status (None: 0)
    epilog: str | None = None  # shown below the options of `leaf NAME --help`, as written

    @classmethod
    def from_module(cls, module: ModuleType) -> "Command":
        """The command a module defines with ``HELP``, ``add_arguments``, ``run`` and
        optionally ``EPILOG`` (the built-in commands' layout)."""
        return cls(module.HELP, module.add_arguments, module.run, getattr(module, "EPILOG", None))
