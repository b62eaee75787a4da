"""``rollout.backend``: which engine samples the responses.

``static`` is our own decode loop (``decoding/static_rollout.py``); ``generate`` is
Hugging Face ``generate`` (``generate_rollout.py``), kept as the reference. Left unset,
the static loop runs on the CPU wherever it supports the model; on CUDA ``generate``
runs unless ``STATIC_BY_DEFAULT_ON_CUDA`` says otherwise (``static`` is opt-in there:
its captured step checks itself against the eager step on the first rollout and falls
back to ``generate`` with a warning on a mismatch). Where the loop does not support the
model, ``generate`` runs with one notice saying why; asking for ``static`` on a model it
does not support is an error.
"""

from __future__ import annotations

import warnings
from typing import Any

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.training.decoding.family import unsupported_reason

__all__ = ["ROLLOUT_BACKENDS", "resolve_backend"]

ROLLOUT_BACKENDS = ("static", "generate")

STATIC_BY_DEFAULT_ON_CUDA = False
"""Whether an unset ``rollout.backend`` picks the static loop on CUDA devices too."""


def _on_cuda(model: Any) -> bool:
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter is not None and parameter.device.type == "cuda"


def resolve_backend(model: Any, requested: str | None) -> str:
    """The backend that samples from ``model``: ``requested``, or for None ``static``
    where supported (on CUDA only with ``STATIC_BY_DEFAULT_ON_CUDA``), else ``generate``
    (with a warning, shown once per process, where the loop does not support the model).

    :raises ConfigError: ``static`` requested for a model it does not support (the
        message names the model type and what is unsupported), or an unknown name.
    """
    if requested is not None and requested not in ROLLOUT_BACKENDS:
        raise ConfigError(f"rollout.backend must be one of {', '.join(ROLLOUT_BACKENDS)}, got {requested!r}")
    if requested == "generate" or (requested is None and _on_cuda(model) and not STATIC_BY_DEFAULT_ON_CUDA):
        return "generate"
    reason = unsupported_reason(model)
    if reason is None:
        return "static"
    if requested == "static":
        raise ConfigError(f"rollout.backend=static: {reason}. Use rollout.backend=generate (Hugging Face generate)")
    warnings.warn(f"{reason}: the rollout uses rollout.backend=generate (Hugging Face generate) instead", stacklevel=2)
    return "generate"
