"""Sub-commands of the ``leaf`` console script, one module each.

Every module here defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; ``leaf_plugins.cli`` discovers them.
"""
