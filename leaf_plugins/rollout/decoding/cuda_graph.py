"""The decode step captured once as a CUDA graph, checked against the eager step, and
replayed.

The step reads and writes only static tensors (``DecodeState``, ``KVBuffers``, the
model's weights) and never synchronises with the host, so after a few eager warm-up
steps on a side stream (which initialise cuBLAS workspaces and the allocator, as
``torch.cuda.graph`` requires) it is recorded once and every later step is one graph
replay: no Python, no kernel launches from the host. The warm-up steps are real steps
of the rollout (they advance the state like any other). The step reads no random
generator: its samples are keyed draws from the state's keys and column
(``keyed_draw.py``), which a replay reads like any other buffer.

The self-check: the step the graph records is first run eagerly from a snapshot of the
state, the state is restored, and the graph's
first replay must then give the same tokens and log-probabilities (within
``CHECK_TOLERANCE``); otherwise ``GraphMismatch`` says how they differ, and a capture
that fails raises ``GraphUnusable`` with the error. The capture
itself is a parameter (``cuda_capture`` on CUDA), so the check and the replay logic run
on the CPU too with a capture that replays the recorded function eagerly.
"""

from __future__ import annotations

from typing import Callable

import torch

from leaf_plugins.rollout.decoding.decode_state import DecodeState

__all__ = ["GraphedStep", "GraphUnusable", "GraphMismatch", "cuda_capture", "eager_capture", "CHECK_TOLERANCE"]

Step = Callable[[], None]
Capture = Callable[[Step], Step]  # records a step, returns what replays it

CHECK_TOLERANCE = 1e-3
"""Largest ``|Δ log π|`` the self-check accepts between the captured and the eager step.
The graph replays the very kernels the eager step launches, on the same inputs, so the
two agree bit for bit unless a kernel is chosen differently under capture; a different
cuBLAS algorithm for a bf16 product moves a logit by about one bf16 rounding (2^-8
relative, a few 1e-3 on logits of magnitude 1), of which log π keeps a fraction. 1e-3 is
far below a logit's rounding (so it still catches a wrong mask, slot or position, which
move log π by 0.1 and more) while tolerating a reordered sum in float32."""


class GraphUnusable(RuntimeError):
    """The step cannot run as a captured graph (the message says why)."""


class GraphMismatch(GraphUnusable):
    """The captured step did not reproduce the eager step (the message says how)."""


def cuda_capture(step: Step) -> Step:
    """Record ``step`` as a CUDA graph (nothing runs) and return its replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def eager_capture(step: Step) -> Step:
    """The CPU stand-in for ``cuda_capture``: replaying runs ``step`` itself, the same
    function over the same buffers (for testing the loop's static path on the CPU)."""
    return step


class GraphedStep:
    """Call it once per decode step: the first ``warmup`` calls run ``step`` eagerly
    (on a side stream on CUDA), the next one runs the self-check, captures the step and
    replays it; later calls replay. A replay after a finished rollout needs only the
    state and buffers reset in place: the capture is reused across rollouts."""

    def __init__(self, step: Step, state: DecodeState, capture: Capture = cuda_capture, warmup: int = 2,
                 check: bool = True) -> None:
        self.step = step
        self.state = state
        self.capture = capture
        self.warmup = warmup
        self.check = check
        self.replay: Step | None = None
        self.stream: torch.cuda.Stream | None = None

    @property
    def captured(self) -> bool:
        """Whether the step has been recorded (later calls only replay)."""
        return self.replay is not None

    def __call__(self) -> None:
        if self.replay is not None:
            self.replay()
            return
        device = self.state.tokens.device
        if self.warmup > 0:
            self.warmup -= 1
            if device.type != "cuda":
                self.step()
                return
            self.stream = self.stream or torch.cuda.Stream(device)
            self.stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(self.stream):
                self.step()
            torch.cuda.current_stream(device).wait_stream(self.stream)
            return
        expected = self._eager_outputs() if self.check else None
        try:
            replay = self.capture(self.step)
        except RuntimeError as error:  # e.g. an operation that synchronises, or no memory left for the graph
            raise GraphUnusable(f"the decode step could not be captured as a CUDA graph ({error})") from error
        replay()
        if expected is not None:
            self._compare(expected)
        self.replay = replay

    def _eager_outputs(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Run the step eagerly, keep the column it wrote, and put the state back as it
        was (the generated slot it wrote is written again, with the same values, by the
        replay)."""
        saved = self.state.snapshot()
        self.step()
        column = int(saved.column)  # one host synchronisation, once per capture
        tokens = self.state.generated[:, column].clone()  # [N]
        logprobs = self.state.logprobs[:, column].clone()  # [N]
        self.state.restore(saved)
        return column, tokens, logprobs

    def _compare(self, expected: tuple[int, torch.Tensor, torch.Tensor]) -> None:
        column, tokens, logprobs = expected
        replayed_tokens = self.state.generated[:, column]
        replayed = self.state.logprobs[:, column]
        differing = int((replayed_tokens != tokens).sum())
        if differing:
            raise GraphMismatch(f"the captured decode step sampled other tokens than the eager step in {differing} "
                                f"of {tokens.numel()} rows")
        gap = float((replayed - logprobs).abs().max()) if logprobs.numel() else 0.0
        if not gap <= CHECK_TOLERANCE:  # NaN fails too
            raise GraphMismatch(f"the captured decode step's log-probabilities differ from the eager step's by up to "
                                f"{gap:.3g} (tolerance {CHECK_TOLERANCE:g})")
