"""The decode step captured once as a CUDA graph and replayed.

The step reads and writes only static tensors (``DecodeState``, ``KVBuffers``, the
model's weights) and never synchronises with the host, so after a few eager warm-up
steps on a side stream (which initialise cuBLAS workspaces and the allocator, as
``torch.cuda.graph`` requires) it is recorded once and every later step is one graph
replay: no Python, no kernel launches from the host. The warm-up steps are real steps
of the rollout (they advance the state like any other). Random numbers drawn inside the
graph (the sampling race) come from the default CUDA generator, whose offsets graph
replays advance.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["GraphedStep"]


class GraphedStep:
    """Call it once per decode step: the first ``warmup`` calls run ``step`` eagerly on
    a side stream, the next one captures it and replays it, later ones replay."""

    def __init__(self, step: Callable[[], None], warmup: int = 2) -> None:
        self.step = step
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.stream: torch.cuda.Stream | None = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self.warmup > 0:
            self.warmup -= 1
            self.stream = self.stream or torch.cuda.Stream()
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self.step()
            torch.cuda.current_stream().wait_stream(self.stream)
            return
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the step's kernels; nothing runs yet
            self.step()
        self.graph = graph
        graph.replay()
