"""A plugin whose import fails, as a broken third-party plugin would."""

raise ImportError("leaf_broken needs a package that is not installed (this plugin is broken on purpose)")
