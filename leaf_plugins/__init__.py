"""leaf-plugins: tree-credit estimators for RL post-training of speech-aware LLMs."""

from __future__ import annotations

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.engine import Engine, estimate
from leaf_plugins.core.errors import ConfigError, LeafError, UnknownNameError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.parameters import NoParameters
from leaf_plugins.core.plugins import get_host
from leaf_plugins.core.tree import Boundaries, EstimateResult, Node, Nodes

__version__ = "0.1.0"

__all__ = [
    "Boundaries",
    "ConfigError",
    "Engine",
    "EstimateResult",
    "LeafError",
    "NoParameters",
    "Node",
    "Nodes",
    "RolloutBatch",
    "UnknownNameError",
    "__version__",
    "estimate",
    "get_host",
    "hookimpl",
]
