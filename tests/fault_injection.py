"""SIGKILL, SIGINT or SIGTERM at chosen instants of ``leaf train`` / ``leaf study``: a
process (forked from a fork server that imported the package once) patches one function
so that its n-th call sends the signal to the process itself, as ``kill -9``, Ctrl-C or
``kill`` would, then runs the command.

A kill point is ``(name, n)``: the signal arrives at the n-th time the process reaches
``name``. Under SIGKILL the two torn-write points write half a line first (a kill
mid-write); under SIGINT/SIGTERM, which Python handles between bytecodes, they signal
just before the write instead.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
from typing import Any, Callable

POINTS: dict[str, str] = {
    "sampling": "inside the rollout, at a token draw (the static loop's sampling step, generate's torch.multinomial)",
    "scoring": "after generation, before the rewards are scored",
    "estimate": "before the estimator runs",
    "backward": "in the update, before a micro-batch's backward",
    "optimizer.step": "right after the optimizer stepped (weights changed, step not yet logged)",
    "metrics.write": "half-way through writing a metrics.jsonl line (a torn line)",
    "rollouts.write": "half-way through writing a rollouts.jsonl line (a torn line)",
    "checkpoint.adapter": "checkpoint write: adapter saved, optimizer state not yet",
    "checkpoint.rename": "checkpoint write: fsynced, not yet renamed to checkpoint-N",
    "checkpoint.prune": "checkpoint write: renamed, older checkpoint not yet deleted",
    "checkpoint.saved": "right after a checkpoint was written",
    "log.rewrite": "resume: a log's truncated copy written, not yet renamed over it",
    "evaluate": "study: a run trained, its held-out evaluation not yet written",
}


_SIGNAL = [signal.SIGKILL]  # what ``_die`` sends: set by ``_command``


def _die() -> None:
    os.kill(os.getpid(), _SIGNAL[0])


def _countdown(n: int) -> Callable[[], bool]:
    left = [n]

    def reached() -> bool:
        left[0] -= 1
        return left[0] == 0

    return reached


def _patch(owner: Any, attribute: str, make: Callable[[Callable], Callable]) -> None:
    setattr(owner, attribute, make(getattr(owner, attribute)))


def _arm(point: str, n: int) -> None:
    """Patch the function of ``point`` so that its n-th call kills the process."""
    import torch

    from leaf_plugins.core import engine
    from leaf_plugins.rollout import log as rollout_log
    from leaf_plugins.studies import runner
    from leaf_plugins.training import checkpoint, durable, trainer

    reached = _countdown(n)

    def before(original: Callable) -> Callable:
        @functools.wraps(original)  # keeps pluggy's hookimpl marker
        def call(*args, **kwargs):
            if reached():
                _die()
            return original(*args, **kwargs)
        return call

    def after(original: Callable) -> Callable:
        @functools.wraps(original)
        def call(*args, **kwargs):
            value = original(*args, **kwargs)
            if reached():
                _die()
            return value
        return call

    if point == "sampling":
        from leaf_plugins.rollout.decoding.sampling_step import SamplingStep

        _patch(SamplingStep, "__call__", before)  # rollout.backend static
        _patch(torch, "multinomial", before)  # rollout.backend generate
    elif point == "scoring":
        _patch(trainer.DefaultStages, "score_rollouts", before)
    elif point == "estimate":
        _patch(engine.Engine, "estimate", before)
    elif point == "backward":
        from accelerate import Accelerator
        _patch(Accelerator, "backward", before)
    elif point == "optimizer.step":
        _patch(torch.optim.Adam, "step", after)
    elif point == "metrics.write" and _SIGNAL[0] != signal.SIGKILL:
        _patch(trainer.Trainer, "_log", before)
    elif point == "rollouts.write" and _SIGNAL[0] != signal.SIGKILL:
        _patch(rollout_log, "write_groups", before)
    elif point == "metrics.write":
        def log(original: Callable) -> Callable:
            def call(self, step, metrics):
                if reached():
                    import json
                    line = json.dumps({"step": step, **metrics}) + "\n"
                    with (self.output_dir / "metrics.jsonl").open("a") as handle:
                        handle.write(line[: len(line) // 2])
                    _die()
                return original(self, step, metrics)
            return call
        _patch(trainer.Trainer, "_log", log)
    elif point == "rollouts.write":
        def write(original: Callable) -> Callable:
            def call(handle, groups):
                groups = list(groups)
                if groups and reached():
                    import json
                    line = json.dumps(groups[0].record(), separators=(",", ":")) + "\n"
                    handle.write(line[: len(line) // 2])
                    handle.flush()
                    _die()
                return original(handle, groups)
            return call
        _patch(rollout_log, "write_groups", write)
    elif point == "checkpoint.adapter":
        _patch(checkpoint.torch, "save", before)
    elif point == "checkpoint.rename":
        _patch(checkpoint, "fsync_tree", after)
    elif point == "checkpoint.prune":
        def prune(original: Callable) -> Callable:
            def call(path, *args, **kwargs):
                if os.path.basename(str(path)).startswith("checkpoint-") and reached():
                    _die()
                return original(path, *args, **kwargs)
            return call
        _patch(checkpoint.shutil, "rmtree", prune)
    elif point == "checkpoint.saved":
        _patch(trainer, "save_checkpoint", after)
    elif point == "log.rewrite":
        _patch(durable.os, "replace", before)
    elif point == "evaluate":
        _patch(runner, "_evaluate", before)
    else:
        raise ValueError(f"unknown kill point {point!r}; known: {', '.join(POINTS)}")


def _command(argv: list[str], point: str | None, n: int, signal_number: int, stderr: str | None) -> None:
    import sys
    import warnings

    from leaf_plugins.cli import main

    if stderr is not None:
        os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (the fork server ignores it)
    warnings.simplefilter("ignore")
    _SIGNAL[0] = signal_number
    if point is not None:
        _arm(point, n)
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


_CONTEXT: Any = None


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["leaf_plugins.cli", "leaf_plugins.training.trainer",
                                         "leaf_plugins.studies.runner", __name__])
    return _CONTEXT


def run_leaf(argv: list[str], point: str | None = None, n: int = 1, timeout: float = 600,
             signal_number: int = signal.SIGKILL, stderr: str | None = None) -> int:
    """Run ``leaf ARGV`` in a fresh process that gets ``signal_number`` (SIGKILL unless
    told) at the n-th time it reaches ``point`` (None: no signal); its exit code (``-9``
    when killed, ``leaf``'s status otherwise). ``stderr``: a file for its standard error."""
    process = _context().Process(target=_command, args=(argv, point, n, signal_number, stderr))
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise TimeoutError(f"leaf {' '.join(argv)} did not finish in {timeout} s")
    return process.exitcode
