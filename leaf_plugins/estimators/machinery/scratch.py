"""Reusable buffers for the large temporaries of an estimator call.

A fresh tensor of several megabytes costs page faults when it is first written, often
more time than the work done in it (up to 400 page faults per full-tree call
on a 64×8×1024 batch, and the ratio to GRPO nearly doubled). The estimators' large
temporaries (prefix hashes, gathered hash rows) are therefore written into buffers kept
per thread and purpose, grown when a larger batch needs it. A buffer is valid until the
next request for the same purpose: callers use it within one call and never return it.
"""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["scratch", "release_scratch"]

_local = threading.local()


def scratch(purpose: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of ``shape`` with undefined contents, reused across calls that
    ask for the same ``purpose``, ``dtype`` and ``device`` in this thread (the same tensor
    object while the shape stays the same: no view operations per call)."""
    shape = tuple(shape)
    key = (purpose, dtype, torch.device(device))
    views: dict[tuple[str, torch.dtype, torch.device], tuple[tuple[int, ...], torch.Tensor]] = (
        _local.__dict__.setdefault("views", {}))
    last = views.get(key)
    if last is not None and last[0] == shape:
        return last[1]
    buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = _local.__dict__.setdefault("buffers", {})
    size = math.prod(shape)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < size:
        with torch.inference_mode(False):  # an ordinary tensor: usable in and out of inference mode
            buffer = buffers[key] = torch.empty(size, dtype=dtype, device=device)
    view = buffer[:size].view(shape)
    views[key] = (shape, view)
    return view


def release_scratch() -> None:
    """Free this thread's buffers (they are re-created on the next estimate)."""
    _local.__dict__.pop("buffers", None)
    _local.__dict__.pop("views", None)
