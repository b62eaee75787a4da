"""The wall time of a rollout's phases (prefill, capture, decode), for benchmarks.

On a GPU each mark is a CUDA event recorded on the current stream (no synchronisation
until the times are read); on the CPU it is the host clock.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["PhaseTimer"]


class PhaseTimer:
    """Marks placed at the end of each phase; ``milliseconds`` gives each phase's time,
    from the mark before it. ``decode_steps`` counts the decode steps of the last
    phase (those after the capture, where there was one)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.decode_steps = 0

    def mark(self, name: str) -> None:
        """End the phase ``name`` now (the first mark only starts the clock)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def milliseconds(self) -> dict[str, float]:
        """Each phase's milliseconds, by name (synchronises on a GPU)."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        found = {}
        for (_, start), (name, end) in zip(self.marks, self.marks[1:]):
            found[name] = start.elapsed_time(end) if self.cuda else 1000 * (end - start)
        return found
