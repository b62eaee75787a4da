"""Sampling: ``sample_responses`` draws K responses per prompt with a registered rollout
backend (the one named, else the default for the model) and returns them as a
``Rollout``: the tokens with their log-probabilities, surprisal and the optional
per-token statistics asked for.

Two distributions are involved at every sampled position:

* the *sampling* distribution: the model's logits with the audio tokens banned, divided
  by the temperature, then top-p filtered (what is sampled from);
* the *policy* distribution: the logits divided by the temperature, without top-p.

``logprobs`` (π_old in the loss ratio) and ``sum_pi_squared`` (Σ_v π_old(v)², which the
variance-aware estimators read) are always under the policy distribution, which is
what ``response_logprobs`` (``training/teacher_forcing.py``) computes for π_θ and π_ref,
so the ratio is 1 before the first update (up to the rounding of the two computations,
see docs/training.md).
``surprisal_from`` chooses the distribution of the surprisal LEAF uses to pick
boundaries: ``"sampling"`` (the default, as the authors' code: after temperature and
top-p) or ``"policy"`` (``-logprobs``).

A rollout backend samples (``rollout.backend``, ``backends.py``): ``static``, our
own decode loop over static K/V buffers (``decoding/static_rollout.py``, the default on
the CPU wherever the model is supported, opt-in on CUDA), ``generate``, Hugging Face ``generate``
(``generate.py``, the reference), or one a package registered. They draw from
the same distributions and return the same ``Rollout``.
"""

from __future__ import annotations

from typing import Any, Mapping

from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.stages import Rollout, RolloutRequest
from leaf_plugins.rollout.assembly import SURPRISAL_SOURCES
from leaf_plugins.rollout.backends import resolve_backend

__all__ = ["sample_responses"]


def sample_responses(request: RolloutRequest, backend: str | None = None,
                     backend_params: Mapping[str, Any] | None = None, host: PluginHost | None = None) -> Rollout:
    """Sample ``request.group_size`` responses for every prompt of ``request.inputs``
    (left padded) with a rollout backend, which receives ``request`` as it is.

    The prompts are embedded once (``inputs["inputs_embeds"]`` when the caller already
    has them, see ``embed_prompts``), so the audio encoder runs once per prompt. The
    per-token statistics are taken at each step: memory ``O(N·T)``, not ``O(N·T·V)``.
    Generation stops at EOS, which belongs to the response; what follows is padding.
    Response k of the prompt with group id ``g`` (``request.group_ids``, default its
    row) draws from the key (``request.seed``, g, k), the same in any batch
    (``decoding/keyed_draw.py``).

    :param backend: a registered rollout backend (``"static"``, ``"generate"``, a
        package's), or None: ``static`` where the model is supported (on CUDA only where
        ``STATIC_BY_DEFAULT_ON_CUDA``), else ``generate`` (``backends.resolve_backend``).
    :param backend_params: the backend's parameters (``rollout.backend_params``).
    :raises ValueError: ``request.surprisal_from`` is not one of ``SURPRISAL_SOURCES``.
    """
    if request.surprisal_from not in SURPRISAL_SOURCES:
        raise ValueError(f"surprisal_from must be one of {SURPRISAL_SOURCES}, got {request.surprisal_from!r}")
    host = host or get_host()
    name = resolve_backend(request.model, backend, host)
    sampler = configured("rollout backend", name, host.rollout_backends.get(name), backend_params)
    return sampler.sample(request)
