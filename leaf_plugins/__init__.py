"""leaf-plugins: tree-credit estimators for RL post-training of speech-aware LLMs.

The names below are imported on first use (PEP 562), so ``import leaf_plugins`` (and the
``leaf`` command's start-up, which handles Ctrl-C from its first moment) does not wait
for torch. ``__version__`` is ``core.version.package_version()``, read on first use too."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leaf_plugins.core.batch import PER_TOKEN_FIELDS, RolloutBatch
    from leaf_plugins.core.command import Command
    from leaf_plugins.core.engine import Engine, estimate
    from leaf_plugins.core.errors import ConfigError, LeafError, UnknownNameError
    from leaf_plugins.core.hookspecs import hookimpl
    from leaf_plugins.core.parameters import NoParameters, configured, parameterised
    from leaf_plugins.core.plugins import get_host
    from leaf_plugins.core.tree import Boundaries, EstimateResult, Node, Nodes, root_only_nodes

    __version__: str

_HOMES = {
    "RolloutBatch": "leaf_plugins.core.batch",
    "PER_TOKEN_FIELDS": "leaf_plugins.core.batch",
    "Command": "leaf_plugins.core.command",
    "Engine": "leaf_plugins.core.engine",
    "estimate": "leaf_plugins.core.engine",
    "ConfigError": "leaf_plugins.core.errors",
    "LeafError": "leaf_plugins.core.errors",
    "UnknownNameError": "leaf_plugins.core.errors",
    "hookimpl": "leaf_plugins.core.hookspecs",
    "NoParameters": "leaf_plugins.core.parameters",
    "configured": "leaf_plugins.core.parameters",
    "parameterised": "leaf_plugins.core.parameters",
    "get_host": "leaf_plugins.core.plugins",
    "Boundaries": "leaf_plugins.core.tree",
    "EstimateResult": "leaf_plugins.core.tree",
    "Node": "leaf_plugins.core.tree",
    "Nodes": "leaf_plugins.core.tree",
    "root_only_nodes": "leaf_plugins.core.tree",
}

__all__ = [
    "Boundaries",
    "Command",
    "ConfigError",
    "Engine",
    "EstimateResult",
    "LeafError",
    "NoParameters",
    "Node",
    "Nodes",
    "PER_TOKEN_FIELDS",
    "RolloutBatch",
    "UnknownNameError",
    "__version__",
    "configured",
    "estimate",
    "get_host",
    "hookimpl",
    "parameterised",
    "root_only_nodes",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from leaf_plugins.core.version import package_version

        value = package_version()
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'leaf_plugins' has no attribute {name!r}")
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
