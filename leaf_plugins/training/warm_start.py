"""Warm start: supervised fine-tuning (teacher forcing on the references) of a backbone,
saved as a checkpoint that RL training loads (``backbone.path``).

Random-weight tiny backbones know nothing, so RL alone cannot be shown on them; a few
CPU minutes of this bring one to a partial level on a built-in task.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from leaf_plugins.core.interrupts import interrupt_point
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.task import Example
from leaf_plugins.training.config import BackboneConfig, TaskConfig
from leaf_plugins.training.durable import fsync_directory, fsync_tree
from leaf_plugins.training.ranges import WARM_START_RANGES
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.training.threads import apply_threads

__all__ = ["WarmStartConfig", "warm_start", "reference_tokens", "load_warm_start_config", "warm_start_validators"]


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning of every weight of the backbone (meant for the tiny ones)."""

    output_dir: str = "runs/warm-start"
    seed: int = 0
    epochs: int = 6
    batch_size: int = 8
    learning_rate: float = 2e-3
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    task: TaskConfig = field(default_factory=TaskConfig)


def load_warm_start_config(path: Path, overrides: Sequence[str] = (), host: PluginHost | None = None) -> WarmStartConfig:
    """A ``WarmStartConfig`` from YAML and ``a.b=value`` overrides (errors as for runs)."""
    from leaf_plugins.core.config import load_config

    return load_config(WarmStartConfig, path, overrides, warm_start_validators(host or get_host()))


def warm_start_validators(host: PluginHost, prefix: str = "") -> dict:
    """The checks of a warm-start config's registered names, keyed by dotted path."""
    from leaf_plugins.training.config import registered

    checks = {"backbone.name": registered(host.backbones), "task.name": registered(host.tasks), **WARM_START_RANGES}
    return {prefix + key: check for key, check in checks.items()}


def reference_tokens(tokenizer, references: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, T]`` token ids of each reference followed by EOS (``-1`` padded), and ``[N]``
    lengths: what the model should generate."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in references]
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), -1, dtype=torch.int64)
    for index, row in enumerate(rows):
        tokens[index, : len(row)] = torch.tensor(row)
    return tokens, torch.tensor([len(row) for row in rows])


def warm_start(config: WarmStartConfig, examples: Sequence[Example], host: PluginHost | None = None) -> Path:
    """Fine-tune on ``examples`` and save the model and processor to
    ``output_dir/model``; per-epoch losses go to ``output_dir/metrics.jsonl``. An existing
    finished checkpoint is reused."""
    output = Path(config.output_dir)
    target = output / "model"
    if (target / "config.json").exists():
        return target
    host = host or get_host()
    backbone = host.backbones.get(config.backbone.name)
    loaded = backbone.load(path=config.backbone.path, dtype=config.backbone.dtype, seed=config.backbone.seed)
    apply_threads(None, loaded.model, rows=config.batch_size)  # torch's threads, as a training run chooses them
    model = loaded.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    order = list(range(len(examples)))
    shuffle = random.Random(config.seed)
    output.mkdir(parents=True, exist_ok=True)
    batches = (len(examples) + config.batch_size - 1) // config.batch_size
    progress = tqdm(total=config.epochs * batches, desc="warm start", unit="batch")
    with (output / "metrics.jsonl").open("w") as log:
        for epoch in range(config.epochs):
            shuffle.shuffle(order)
            total, count = 0.0, 0
            for start in range(0, len(order), config.batch_size):
                interrupt_point()  # Ctrl-C stops between batches (nothing of the warm start is saved until its end)
                chosen = [examples[i] for i in order[start : start + config.batch_size]]
                loss = _batch_loss(backbone, loaded, model, chosen)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, count = total + float(loss.detach()) * len(chosen), count + len(chosen)
                progress.update(1)
                progress.set_postfix(loss=f"{float(loss.detach()):.3f}")
            log.write(json.dumps({"epoch": epoch + 1, "loss": total / count}) + "\n")
            log.flush()
    progress.close()
    model.eval()
    partial = output / "model.partial"
    model.save_pretrained(partial)
    loaded.processor.save_pretrained(partial)
    loaded.tokenizer.save_pretrained(partial)
    fsync_tree(partial)
    partial.rename(target)
    fsync_directory(output)
    return target


def _batch_loss(backbone, loaded, model, chosen: Sequence[Example]) -> torch.Tensor:
    """Mean negative log-likelihood per reference token (EOS included)."""
    inputs = backbone.build_inputs(loaded, [e.prompt for e in chosen], [e.audio for e in chosen])
    tokens, lengths = reference_tokens(loaded.tokenizer, [e.reference for e in chosen])
    logprobs = response_logprobs(model, inputs, tokens, lengths, torch.arange(len(chosen)))  # [B, T]
    return -logprobs.sum() / lengths.sum()
