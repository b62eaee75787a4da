"""Rollout: K sampled responses per prompt with their log-probabilities and surprisal,
and teacher-forced log-probabilities of given responses (for the loss).

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

from typing import Any, Iterable, Mapping, Sequence

import torch

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.stages import Rollout, RolloutRequest, StepContext
from leaf_plugins.rollout.assembly import SURPRISAL_SOURCES, assemble_rollout, audio_token_ids
from leaf_plugins.rollout.backends import resolve_backend

__all__ = ["Rollout", "sample_responses", "assemble_rollout", "audio_token_ids", "SURPRISAL_SOURCES"]


def sample_responses(
    model: torch.nn.Module,
    loaded: LoadedBackbone,
    inputs: dict[str, torch.Tensor],
    group_size: int,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_p: float = 0.9,
    surprisal_from: str = "sampling",
    group_ids: Sequence[int] | None = None,
    backend: str | None = None,
    context: StepContext | None = None,
    host: PluginHost | None = None,
    seed: int | None = None,
    fields: Iterable[str] | None = None,
    backend_params: Mapping[str, Any] | None = None,
) -> Rollout:
    """Sample ``group_size`` responses for every prompt of ``inputs`` (left padded).

    The prompts are embedded once (``inputs["inputs_embeds"]`` when the caller already
    has them, see ``embed_prompts``), so the audio encoder runs once per prompt. The
    per-token statistics are taken at each step: memory ``O(N·T)``, not ``O(N·T·V)``.
    Generation stops at EOS, which belongs to the response; what follows is padding.

    :param backend: a registered rollout backend (``"static"``, ``"generate"``, a
        package's), or None: ``static`` where the model is supported (on CUDA only where
        ``STATIC_BY_DEFAULT_ON_CUDA``), else ``generate`` (``rollout_backend.resolve_backend``).
    :param context: the training step sampled for (passed on to the backend).
    :param seed: the sampling seed: response k of the prompt with group id ``g`` (from
        ``group_ids``, default its row) draws from the key (seed, g, k), the same in any
        batch (``decoding/keyed_draw.py``); None: a seed drawn from torch's default generator.
    :param fields: the optional per-token statistics to compute (``sum_pi_squared``, a
        backend's extra fields), e.g. an engine's ``requires``; None: all the backend can.
    :param backend_params: the backend's parameters (``rollout.backend_params``).
    """
    if surprisal_from not in SURPRISAL_SOURCES:
        raise ValueError(f"surprisal_from must be one of {SURPRISAL_SOURCES}, got {surprisal_from!r}")
    host = host or get_host()
    name = resolve_backend(model, backend, host)
    sampler = configured("rollout backend", name, host.rollout_backends.get(name), backend_params)
    request = RolloutRequest(model, loaded, inputs, group_size, max_new_tokens, temperature, top_p, surprisal_from,
                             list(group_ids) if group_ids is not None else None, context, seed,
                             frozenset(fields) if fields is not None else None)
    return sampler.sample(request)
