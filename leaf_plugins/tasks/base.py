"""The task protocol (defined in ``leaf_plugins.core.task``), where task plugins import it from."""

from __future__ import annotations

from leaf_plugins.core.task import SPLITS, Example, Task

__all__ = ["Example", "Task", "SPLITS"]
