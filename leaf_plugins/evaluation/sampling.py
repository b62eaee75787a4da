"""Sampled decoding of a trained run (or of its starting model) over held-out examples.

The paper's protocol: temperature 0.9, top-p 0.9, 200 new tokens, N runs. The same pass
with K > 1 samples per prompt gives rollout groups for a fresh forkability analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from tqdm import tqdm

from leaf_plugins.backbones.base import LoadedBackbone
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.stages import Rollout
from leaf_plugins.tasks.base import Example
from leaf_plugins.training.checkpoint import latest_checkpoint
from leaf_plugins.training.config import BackboneConfig
from leaf_plugins.training.rollout import sample_responses
from leaf_plugins.training.stage_plugins import RolloutStage

__all__ = ["Policy", "load_policy", "run_to_sample", "sample_groups", "sample_predictions"]


@dataclass
class Policy:
    """A backbone's model (with a run's LoRA adapter when one was given) ready to sample."""

    backbone: object
    loaded: LoadedBackbone
    model: torch.nn.Module


def load_policy(backbone: BackboneConfig, run_dir: str | Path | None = None, host: PluginHost | None = None) -> Policy:
    """The backbone of ``backbone`` with the adapter of the newest checkpoint of
    ``run_dir`` (a ``leaf train`` output directory) or, with no run, without adapter."""
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
    model.eval()
    return Policy(plugin, loaded, model)


def run_to_sample(output_dir: str | Path, checkpoint: Path | None) -> Path | None:
    """The run directory to sample from: ``checkpoint`` when given, else a run config's
    ``output_dir`` when it holds a checkpoint, else None (the starting model)."""
    if checkpoint is not None:
        return checkpoint
    return Path(output_dir) if latest_checkpoint(Path(output_dir)) is not None else None


def sample_groups(
    policy: Policy, examples: Sequence[Example], samples: int, temperature: float = 0.9, top_p: float = 0.9,
    max_new_tokens: int = 200, batch_prompts: int = 8, seed: int = 0, description: str = "sampling",
    backend: str | None = None, stage: RolloutStage | None = None,
) -> Iterator[Rollout]:
    """``samples`` responses per example, ``batch_prompts`` examples per rollout (each
    batch seeded from ``seed`` and its index, so any batch is reproducible), sampled by
    the ``rollout`` hook of the run's plugins (``stage``) where one returns a rollout,
    else by the rollout ``backend`` (``sample_responses``: None is ``static`` where
    supported)."""
    starts = range(0, len(examples), batch_prompts)
    device = next(policy.model.parameters()).device
    for number, start in enumerate(tqdm(starts, desc=description, unit="batch")):
        chosen = examples[start : start + batch_prompts]
        inputs = policy.backbone.build_inputs(policy.loaded, [e.prompt for e in chosen], [e.audio for e in chosen])
        torch.manual_seed(seed * 1_000_003 + number)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        rollout = stage(number, policy.model, policy.loaded, chosen, inputs, samples, max_new_tokens, temperature,
                        top_p) if stage is not None else None
        yield rollout if rollout is not None else sample_responses(
            policy.model, policy.loaded, inputs, group_size=samples, max_new_tokens=max_new_tokens,
            temperature=temperature, top_p=top_p, group_ids=list(range(start, start + len(chosen))), backend=backend)


def sample_predictions(
    policy: Policy, examples: Sequence[Example], runs: int = 1, temperature: float = 0.9, top_p: float = 0.9,
    max_new_tokens: int = 200, batch_prompts: int = 8, seed: int = 0, backend: str | None = None,
    stage: RolloutStage | None = None,
) -> list[list[str]]:
    """``runs`` lists of predictions, one per example each: the sampled decoding the
    paper's metrics are averaged over (``backend`` and ``stage`` as ``sample_groups``)."""
    texts: list[str] = []
    for rollout in sample_groups(policy, examples, runs, temperature, top_p, max_new_tokens, batch_prompts, seed,
                                 description="evaluating", backend=backend, stage=stage):
        texts.extend(rollout.texts)  # prompt-major: the runs of one example are consecutive
    return [texts[run::runs] for run in range(runs)]
