"""``rollout.backend``: which engine samples the responses.

Backends are a registry (``register_rollout_backends``); this module registers the two
built-ins through that hook, as any package registers its own. ``static`` is our own
decode loop (``decoding/static_rollout.py``); ``generate`` is Hugging Face ``generate``
(``generate.py``), kept as the reference. Left unset, the static loop runs
on the CPU wherever it supports the model; on CUDA ``generate`` runs unless
``STATIC_BY_DEFAULT_ON_CUDA`` says otherwise (``static`` is opt-in there: its captured
step checks itself against the eager step on the first rollout and falls back to
``generate`` with a warning on a mismatch). Where the loop does not support the model,
``generate`` runs with one notice saying why; asking for a backend (built-in or not)
that does not support the model is an error giving its reason.
"""

from __future__ import annotations

import warnings
from typing import Any

from leaf_plugins.core.errors import ConfigError, UnknownNameError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.stages import Rollout, RolloutRequest
from leaf_plugins.rollout.decoding.family import unsupported_reason

__all__ = ["ROLLOUT_BACKENDS", "StaticBackend", "GenerateBackend", "resolve_backend", "backend_unsupported_reason",
           "register_rollout_backends"]

ROLLOUT_BACKENDS = ("static", "generate")  # the built-ins; a package may register others

STATIC_BY_DEFAULT_ON_CUDA = False
"""Whether an unset ``rollout.backend`` picks the static loop on CUDA devices too."""


def _on_cuda(model: Any) -> bool:
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter is not None and parameter.device.type == "cuda"


class StaticBackend:
    """Our decode loop over static K/V buffers (the default on the CPU where it supports the model)."""

    def unsupported_reason(self, model: Any) -> str | None:
        return unsupported_reason(model)

    def sample(self, request: RolloutRequest) -> Rollout:
        from leaf_plugins.rollout.decoding.static_rollout import static_rollout

        return static_rollout(request.model, request.loaded, request.inputs, request.group_size,
                              request.max_new_tokens, request.temperature, request.top_p, request.surprisal_from,
                              request.group_ids, request.seed, wants_sum_pi_squared(request))


class GenerateBackend:
    """Hugging Face generate (every model it can run; the reference)."""

    def sample(self, request: RolloutRequest) -> Rollout:
        from leaf_plugins.rollout.generate import generate_rollout

        return generate_rollout(request.model, request.loaded, request.inputs, request.group_size,
                                request.max_new_tokens, request.temperature, request.top_p, request.surprisal_from,
                                request.group_ids, request.seed, wants_sum_pi_squared(request))


def wants_sum_pi_squared(request: RolloutRequest) -> bool:
    """Whether the rollout should compute Σ_v π(v)² (an exp over the vocabulary per
    sampled token): asked for, or every statistic asked for (``fields`` None)."""
    return request.fields is None or "sum_pi_squared" in request.fields


@hookimpl
def register_rollout_backends(register: Any) -> None:
    register("static", StaticBackend())
    register("generate", GenerateBackend())


def backend_unsupported_reason(backend: Any, model: Any) -> str | None:
    """Why the registered ``backend`` cannot sample from ``model`` (None: it can; a
    backend without ``unsupported_reason`` supports every model)."""
    ask = getattr(backend, "unsupported_reason", None)
    return ask(model) if ask is not None else None


def resolve_backend(model: Any, requested: str | None, host: PluginHost | None = None) -> str:
    """The name of the backend that samples from ``model``: ``requested`` (any registered
    backend that supports the model), or for None ``static`` where supported, else
    ``generate`` (with a warning, shown once per process); on CUDA ``generate`` unless
    ``STATIC_BY_DEFAULT_ON_CUDA``.

    :raises ConfigError: an unknown name (with a did-you-mean), or a backend asked for
        on a model it does not support (the message gives the backend's reason).
    """
    if requested is not None:
        try:
            backend = (host or get_host()).rollout_backends.get(requested)
        except UnknownNameError as error:
            raise ConfigError(f"rollout.backend: {error}") from None
        reason = backend_unsupported_reason(backend, model)
        if reason is not None:
            fallback = " Use rollout.backend=generate (Hugging Face generate)" if requested != "generate" else ""
            raise ConfigError(f"rollout.backend={requested}: {reason}.{fallback}")
        return requested
    if _on_cuda(model) and not STATIC_BY_DEFAULT_ON_CUDA:
        return "generate"
    reason = unsupported_reason(model)
    if reason is None:
        return "static"
    warnings.warn(f"{reason}: the rollout uses rollout.backend=generate (Hugging Face generate) instead", stacklevel=2)
    return "generate"
