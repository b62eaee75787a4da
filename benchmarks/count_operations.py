"""Tensor operations dispatched by one call of each estimator (the fixed cost of a call).

Run: python benchmarks/count_operations.py [prompts K tokens]

Every ATen operation an estimator call dispatches (views included) costs a few
microseconds of host time on a CPU, and on a GPU a kernel launch, whatever the batch
size; this prints how many one call makes, counted with a ``TorchDispatchMode``, on the
speed benchmark's synthetic batch (default: its ``fixed-cost-2x2x8`` size).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import leaf_plugins as lp
from batches import SIZES, synthetic_batch


class OperationCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def operations_per_call(engine: lp.Engine, batch: lp.RolloutBatch) -> int:
    """ATen operations of one ``engine.estimate(batch)``, after one warm-up call."""
    engine.estimate(batch)
    with OperationCounter() as counter:
        engine.estimate(batch)
    return counter.count


def main(argv: list[str]) -> None:
    shape = tuple(int(value) for value in argv) if argv else SIZES["fixed-cost-2x2x8"]
    batch = synthetic_batch(*shape)
    print(f"| estimator | operations per call ({'x'.join(map(str, shape))}) |\n|---|---:|")
    for name in lp.get_host().estimators.names():
        print(f"| {name} | {operations_per_call(lp.Engine(name), batch)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
