"""Sampled decoding of a trained run (or of its starting model) over held-out examples.

The paper's protocol: temperature 0.9, top-p 0.9, 200 new tokens, N runs. The same pass
with K > 1 samples per prompt gives rollout groups for a fresh forkability analysis
(``fresh_sampling``).

Under a launch of several processes (torch.distributed's default group initialised with
more than one process) ``sample_predictions`` is split: process r samples a contiguous
range of the batches (``prompt_share`` over the batches), each batch with the number,
examples and keys it has on one process, and the predictions are gathered onto every
process in rank order, the one-process order. So the predictions are those of one
process, and every process works for about 1/N of the generation's length.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from tqdm import tqdm

from leaf_plugins.core.backbone import LoadedBackbone
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.processes import agreed_interrupt_point, group_rank
from leaf_plugins.core.stages import Rollout, RolloutRequest
from leaf_plugins.core.task import Example
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.checkpoint import latest_checkpoint
from leaf_plugins.training.config import BackboneConfig
from leaf_plugins.training.stage_plugins import RolloutStage
from leaf_plugins.training.whole_step import prompt_share

__all__ = ["Policy", "Sampling", "load_policy", "run_to_sample", "sample_groups", "sample_predictions",
           "EVALUATION_STREAM"]

EVALUATION_STREAM = 0x5EED_E7A1
"""Mixed into the evaluation's sampling seed, so that evaluation under seed s and
training under seed s draw from different keys."""


@dataclass(frozen=True)
class Sampling:
    """How held-out examples are sampled (the defaults are the paper's decoding)."""

    responses: int = 1  # per example: K of a rollout group, or the decoding runs of ``sample_predictions``
    temperature: float = 0.9
    top_p: float = 0.9
    max_new_tokens: int = 200
    batch_prompts: int = 8  # examples per rollout
    seed: int = 0  # example i's response k draws from the key (seed, i, k) (``EVALUATION_STREAM`` mixed in)
    backend: str | None = None  # the rollout backend (``rollout.backend``); None: ``static`` where supported
    backend_params: Mapping[str, Any] | None = None  # its parameters (``rollout.backend_params``)
    stage: RolloutStage | None = None  # the ``rollout`` hook of the run's plugins, which samples where it returns
    # a rollout (``stage_plugins.rollout_stage``)
    fields: frozenset[str] | None = None  # the optional per-token statistics to compute; None: all the backend can


@dataclass
class Policy:
    """A backbone's model (with a run's LoRA adapter when one was given) ready to sample."""

    backbone: object
    loaded: LoadedBackbone
    model: torch.nn.Module


def load_policy(backbone: BackboneConfig, run_dir: str | Path | None = None, host: PluginHost | None = None) -> Policy:
    """The backbone of ``backbone`` with the adapter of the newest checkpoint of
    ``run_dir`` (a ``leaf train`` output directory) or, with no run, without adapter, on
    this process's GPU (``cuda:LOCAL_RANK`` under a launch) where CUDA is available, else
    on the CPU."""
    host = host or get_host()
    plugin = host.backbones.get(backbone.name)
    loaded = plugin.load(path=backbone.path, dtype=backbone.dtype, seed=backbone.seed)
    model = loaded.model
    if run_dir is not None:
        from leaf_plugins.training.lora import load_lora

        checkpoint = latest_checkpoint(Path(run_dir))
        if checkpoint is None:
            raise FileNotFoundError(f"{run_dir}: no checkpoint-* directory to evaluate")
        model = load_lora(model, str(checkpoint / "adapter"))
    if torch.cuda.is_available():
        model.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
    model.eval()
    return Policy(plugin, loaded, model)


def run_to_sample(output_dir: str | Path, checkpoint: Path | None) -> Path | None:
    """The run directory to sample from: ``checkpoint`` when given, else a run config's
    ``output_dir`` when it holds a checkpoint, else None (the starting model)."""
    if checkpoint is not None:
        return checkpoint
    return Path(output_dir) if latest_checkpoint(Path(output_dir)) is not None else None


def sample_groups(policy: Policy, examples: Sequence[Example], sampling: Sampling, description: str = "sampling",
                  rank: int = 0, world: int = 1) -> Iterator[Rollout]:
    """``sampling.responses`` responses per example, ``sampling.batch_prompts`` examples
    per rollout, sampled by the ``rollout`` hook of the run's plugins
    (``sampling.stage``) where one returns a rollout, else by the rollout backend
    (``sample_responses``). Example i's responses are drawn from the keys
    (``sampling.seed``, i, k), so they do not depend on the batch size or on which
    examples share its batch; a plugin's ``rollout`` hook gets torch's default generator
    seeded from the seed and the batch's index.

    With ``world`` > 1 it yields only the rollouts of process ``rank``'s share of the
    batches (``prompt_share`` over the batches: a contiguous range, the first ranges one
    batch longer), each with the batch number, examples and keys it has with ``world`` = 1:
    the shares' rollouts in rank order are the one-process rollouts. A process whose
    share is empty (fewer batches than processes) yields nothing. Before each batch of the
    longest share every process passes an agreed interrupt point (a signal to any process
    stops all of them there), so a caller runs the generator to its end on every process."""
    starts = range(0, len(examples), sampling.batch_prompts)
    device = next(policy.model.parameters()).device
    share = prompt_share(len(starts), rank, world)
    for turn in tqdm(range(len(prompt_share(len(starts), 0, world))), desc=description, unit="batch", disable=rank != 0):
        agreed_interrupt_point()  # every process, as many times as the longest share: a stop is taken by all
        if turn >= len(share):  # a shorter share: this process has sampled all of its batches
            continue
        number = share[turn]
        start = starts[number]
        chosen = examples[start : start + sampling.batch_prompts]
        inputs = policy.backbone.build_inputs(policy.loaded, [e.prompt for e in chosen], [e.audio for e in chosen])
        torch.manual_seed(sampling.seed * 1_000_003 + number)
        request = RolloutRequest(
            policy.model, policy.loaded, {k: v.to(device) for k, v in inputs.items()}, sampling.responses,
            sampling.max_new_tokens, sampling.temperature, sampling.top_p,
            group_ids=list(range(start, start + len(chosen))), seed=sampling.seed ^ EVALUATION_STREAM,
            fields=sampling.fields)
        rollout = sampling.stage(number, chosen, request) if sampling.stage is not None else None
        yield rollout if rollout is not None else sample_responses(request, sampling.backend, sampling.backend_params)


def sample_predictions(policy: Policy, examples: Sequence[Example], sampling: Sampling) -> list[list[str]]:
    """``sampling.responses`` lists of predictions (the decoding runs), one per example
    each: the sampled decoding the paper's metrics are averaged over (sampled as
    ``sample_groups`` samples, without the optional per-token statistics).

    Under a launch of several processes (``processes.group_rank``) every process must call it with
    the same arguments: each samples its share of the batches, and every process returns
    the whole evaluation's predictions, those one process returns."""
    rank, world = group_rank()
    runs = sampling.responses
    texts: list[str] = []
    for rollout in sample_groups(policy, examples, dataclasses.replace(sampling, fields=frozenset()),
                                 description="evaluating", rank=rank, world=world):  # texts only
        texts.extend(rollout.texts)  # prompt-major: the runs of one example are consecutive
    if world > 1:
        shares: list[list[str] | None] = [None] * world
        dist.all_gather_object(shares, texts)  # in rank order: the one-process order
        texts = [text for share in shares for text in share]
    return [texts[run::runs] for run in range(runs)]
