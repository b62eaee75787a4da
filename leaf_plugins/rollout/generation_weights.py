"""Sharded weights gathered once per rollout, not at every layer of every token.

Under FSDP2 each wrapped module all-gathers its parameters before its forward and frees
them after; autoregressive generation would then gather every layer's weights once per
generated token (200 times per rollout). ``gathered_for_generation`` gathers them all
once, keeps them through ``generate`` and reshards afterwards, as TRL does for
DeepSpeed ZeRO-3. Unsharded models pass through unchanged. Nested blocks are safe: only
the outermost one gathers and reshards.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.distributed.fsdp import FSDPModule

__all__ = ["gathered_for_generation"]

_gathered: set[int] = set()  # ids of the FSDP2 modules an enclosing block holds gathered


@contextlib.contextmanager
def gathered_for_generation(model: torch.nn.Module) -> Iterator[None]:
    """Inside this block every FSDP2 module of ``model`` holds its full parameters and
    keeps them across forward passes; on exit they are resharded as before."""
    sharded: list[Any] = [module for module in model.modules()
                          if isinstance(module, FSDPModule) and id(module) not in _gathered]
    _gathered.update(id(module) for module in sharded)
    for module in sharded:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()
            module.set_reshard_after_forward(True, recurse=False)
            _gathered.discard(id(module))
