"""A plugin named in a run config's ``plugins:`` by its module path: its ``rollout`` hook
records which process was asked for which batch (the batch number and its examples' ids)
and returns None, so the rollout backend samples. Each process appends to
``$EVAL_BATCH_LOG/rank<RANK>.txt`` (``RANK`` as torchrun sets it; 0 without a launch)."""

from __future__ import annotations

import os
from pathlib import Path

from leaf_plugins import hookimpl


@hookimpl
def rollout(context):
    log = Path(os.environ["EVAL_BATCH_LOG"]) / f"rank{os.environ.get('RANK', '0')}.txt"
    with log.open("a") as handle:
        handle.write(f"{context.step} {' '.join(example.id for example in context.examples)}\n")
    return None
