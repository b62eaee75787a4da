"""A command plugin whose ``add_arguments`` raises, as a broken third-party command would
(``missing`` is one whose import fails)."""

from leaf_plugins import hookimpl
from leaf_plugins.core.command import Command


def add_arguments(parser):
    raise RuntimeError("this command is broken on purpose")


@hookimpl
def register_commands(register):
    register("broken", Command("A command whose arguments cannot be set up.", add_arguments, lambda args: 0))
