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
           "register_rollout_backends", "ALWAYS_PRODUCED", "DEFAULT_PRODUCES", "produced_fields"]

ROLLOUT_BACKENDS = ("static", "generate")  # the built-ins; a package may register others

ALWAYS_PRODUCED = ("surprisal", "logprobs")
"""The per-token fields every rollout gives (the loss and the estimators' boundaries read them)."""

DEFAULT_PRODUCES = ("sum_pi_squared",)
"""The optional fields a backend (or a rollout plugin) that declares no ``produces`` can compute."""

STATIC_BY_DEFAULT_ON_CUDA = False
"""Whether an unset ``rollout.backend`` picks the static loop on CUDA devices too."""


def _on_cuda(model: Any) -> bool:
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter is not None and parameter.device.type == "cuda"


class StaticBackend:
    """Our decode loop over static K/V buffers (the default on the CPU where it supports the model)."""

    produces = ("sum_pi_squared",)

    def unsupported_reason(self, model: Any) -> str | None:
        return unsupported_reason(model)

    def sample(self, request: RolloutRequest) -> Rollout:
        from leaf_plugins.rollout.decoding.static_rollout import static_rollout

        return static_rollout(request)


class GenerateBackend:
    """Hugging Face generate (every model it can run; the reference)."""

    produces = ("sum_pi_squared",)

    def sample(self, request: RolloutRequest) -> Rollout:
        from leaf_plugins.rollout.generate import generate_rollout

        return generate_rollout(request)


@hookimpl
def register_rollout_backends(register: Any) -> None:
    register("static", StaticBackend())
    register("generate", GenerateBackend())


def produced_fields(producer: Any) -> tuple[str, ...]:
    """The per-token fields a rollout backend (or a plugin's ``rollout`` hook) gives: the
    fields every rollout has, then what it declares in ``produces`` (``DEFAULT_PRODUCES``
    when it declares nothing)."""
    return (*ALWAYS_PRODUCED, *getattr(producer, "produces", DEFAULT_PRODUCES))


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
