"""A command plugin whose import fails, as a broken third-party command would."""

raise ImportError("leaf_broken_commands.missing needs a package that is not installed (broken on purpose)")
