"""A stub of weight synchronisation with an external rollout engine, on the lifecycle hooks.

Named in a run config (``plugins: [weight-sync]``, or ``plugins: [{name: weight-sync,
params: {every: 2}}]``), it counts the run's optimizer steps and, after every
``every``-th, "pushes" the adapter: it records the training step, the optimizer step
within it and a checksum of the adapter's weights, where a real plugin would send them
to a vLLM or SGLang server. Its count and pushes are saved with every checkpoint and
restored on resume, so an interrupted and resumed run records what an uninterrupted one
does; at the end of the run they are written to ``weight-sync.json`` in the run
directory (the ``record`` parameter).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from leaf_plugins import hookimpl, parameterised


@dataclass(frozen=True)
class WeightSyncParams:
    """The weight sync's parameters."""

    every: int = field(default=1, metadata={"help": "push the adapter after every N-th optimizer step (N >= 1)"})
    record: str = field(default="weight-sync.json", metadata={
        "help": "file in the run directory the pushes are written to at the end of the run"})

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be an integer >= 1, got {self.every!r}")
        if not self.record or Path(self.record).name != self.record:
            raise ValueError(f"record must be a file name (no directory), got {self.record!r}")


@parameterised(WeightSyncParams)
class WeightSync:
    """Pushes the adapter to a (stub) rollout engine after every N-th optimizer step."""

    def __init__(self, params: WeightSyncParams) -> None:
        self.params = params
        self.optimizer_steps = 0
        self.pushes: list[dict[str, Any]] = []  # {"step", "update", "checksum"} of each push

    @hookimpl
    def on_run_start(self, model, optimizer, config, output_dir) -> None:
        """A real plugin would connect to its engine here and push the starting weights."""
        self.optimizer_steps, self.pushes = 0, []

    @hookimpl
    def on_optimizer_step(self, model, optimizer, step: int, update: int) -> None:
        self.optimizer_steps += 1
        if self.optimizer_steps % self.params.every == 0:
            self.pushes.append({"step": step, "update": update, "checksum": _checksum(model)})

    @hookimpl
    def save_plugin_state(self, step: int, output_dir) -> dict[str, Any]:
        return {"optimizer_steps": self.optimizer_steps, "pushes": list(self.pushes)}

    @hookimpl
    def load_plugin_state(self, state: dict[str, Any], step: int, output_dir) -> None:
        self.optimizer_steps, self.pushes = state["optimizer_steps"], list(state["pushes"])

    @hookimpl
    def on_run_end(self, model, optimizer, config, output_dir) -> None:
        record = {"optimizer_steps": self.optimizer_steps, "pushes": self.pushes}
        (Path(output_dir) / self.params.record).write_text(json.dumps(record, indent=1))


def _checksum(model: torch.nn.Module) -> float:
    """The sum of the trained (adapter) weights, as float64: what the engine would receive, in one number."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters() if p.requires_grad))
