"""The error for bad task data: names the file, the row and the key."""

from __future__ import annotations

from leaf_plugins.core.errors import LeafError

__all__ = ["DataError"]


class DataError(LeafError):
    """A data file is missing or malformed (the message names the file, row and key)."""
