"""The processes of a launch (``torchrun``, ``accelerate launch``, a scheduler's tasks)
and what they decide together: where they stop, how they wait, and who reports a failure.

* ``launch_rank``: this process's rank and the launch's number of processes;
  ``group_rank``: the same in torch.distributed's default group, where it is initialised.
* ``agreed_interrupt_point``: a safe point that every process reaches at the same place
  of its work; a signal received by any process stops them all there
  (``core/interrupts.py``).
* ``patient_barrier``: every process waits for the others for as long as it takes (the
  main process scoring an evaluation or running a warm start), on a gloo group of its
  own whose timeout is days, not the default group's minutes.
* ``report_failure``: an error is said once, by the process that had it. A failure that
  every process has alike (a config error) is said by the main process alone; one
  process's own failure is said by it, naming it; a process whose collective failed
  because another one ended says nothing when that one has said why. The processes
  agree through the launch's key-value store (the one ``torchrun`` serves at
  ``MASTER_ADDR:MASTER_PORT``), without a collective.

Nothing here imports torch until a launch of several processes needs it, so that
``leaf --help`` stays quick.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from leaf_plugins.core.interrupts import Interrupted, interrupt_point, received

__all__ = ["launch_rank", "group_rank", "agreed_interrupt_point", "patient_barrier", "is_collective_failure", "report_failure",
           "note_said", "PATIENCE", "SAME_FAILURE_WAIT", "PEER_MESSAGE_WAIT"]

PATIENCE = timedelta(days=7)
"""How long ``patient_barrier`` waits: longer than any evaluation or warm start."""

SAME_FAILURE_WAIT = 1.0
"""Seconds a failing process gives the others to fail alike before it speaks (the main
process then speaks for all of them)."""

PEER_MESSAGE_WAIT = 3.0
"""Seconds a process whose collective failed waits for the process that ended to have
said why, before it says what it saw itself."""


def launch_rank() -> tuple[int, int]:
    """This process's rank and the launch's number of processes: torch.distributed's
    default group where it is initialised, else the launcher's ``RANK`` and
    ``WORLD_SIZE``, else ``(0, 1)``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def group_rank() -> tuple[int, int]:
    """This process's rank and the number of processes of torch.distributed's default
    group; ``(0, 1)`` where it is not initialised (the processes that work together)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _initialised() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _collective_device() -> Any:
    """The device the default group communicates on: this process's GPU for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agreed_interrupt_point() -> None:
    """A safe point that every process of the launch reaches at the same place: if any
    of them has received SIGINT or SIGTERM, all raise ``Interrupted`` here (with the
    highest signal number received, so SIGTERM wins over SIGINT), and the work unwinds
    alike on every process. One all-reduce of one number; on one process, the local
    ``interrupt_point``."""
    if not _initialised():
        interrupt_point()
        return
    import torch
    import torch.distributed as dist

    own = received()
    flag = torch.tensor([own.signal_number if own is not None else 0], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    number = int(flag.item())
    if number:
        raise own if own is not None and own.signal_number == number else Interrupted(number)


_patient_groups: dict[int, Any] = {}  # id of the default group -> its patient gloo group


def patient_barrier() -> None:
    """Wait until every process of the launch gets here, however long that takes (up to
    ``PATIENCE``): the main process may be scoring, judging or warm-starting while the
    others wait. A gloo group of its own, so neither NCCL's nor the default group's
    timeout applies; a process that ends meanwhile ends the wait of the others at once
    (its connections close). On one process it returns."""
    if not _initialised():
        return
    import torch.distributed as dist

    key = id(dist.group.WORLD)
    if key not in _patient_groups:  # every process creates it at its first wait: the same call everywhere
        _patient_groups[key] = dist.new_group(backend="gloo", timeout=PATIENCE)
    dist.barrier(group=_patient_groups[key])


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` was raised by a torch.distributed collective (a process of the
    launch ended, or a timeout): a ``torch.distributed.DistError``, or an error raised
    from within torch.distributed's collectives (gloo reports a closed connection as a
    plain ``RuntimeError``)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(error, getattr(dist, "DistError", ())):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.join("torch", "distributed", "") in frames[-1].filename and any(
        name in frames[-1].filename for name in ("distributed_c10d.py", "c10d_logger.py"))


class _Store:
    """The launch's key-value store, reached as a client (None where there is none, or it
    cannot be reached: then every process speaks for itself)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.tried = False

    def get(self) -> Any:
        if self.tried:
            return self.client
        self.tried = True
        address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not address or not port:
            return None
        try:
            import torch.distributed as dist

            client = dist.TCPStore(address, int(port), is_master=False, timeout=timedelta(seconds=5),
                                   wait_for_workers=False)
            prefix = (f"leaf-plugins/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/"
                      f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
            self.client = dist.PrefixStore(prefix, client)
        except Exception:  # the process that served it has ended: no agreement to be had
            self.client = None
        return self.client


_store = _Store()


def _add(key: str, amount: int = 1) -> int | None:
    """Add ``amount`` to the counter ``key`` in the launch's store and return its value
    (``amount`` 0 reads it); None where there is no store."""
    store = _store.get()
    if store is None:
        return None
    try:
        return int(store.add(key, amount))
    except Exception:
        return None


def _count(key: str) -> int:
    """The counter ``key`` of the launch's store (0 where there is none)."""
    return _add(key, 0) or 0


def note_said() -> None:
    """Record in the launch's store that a process has said why the launch ends (an
    error, or the main process's "interrupted" line): processes whose collectives then
    fail stay quiet."""
    _add("said")


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def report_failure(error: BaseException, text: str) -> str | None:
    """What this process of a launch of several should print for ``error`` that ended its
    command (None: nothing); ``text`` is the error's description (a one-line message, or
    a traceback).

    * A failed collective: nothing when another process has said why the launch ends
      (waiting up to ``PEER_MESSAGE_WAIT`` for it); otherwise, from the first process to
      claim it, what failed, naming that process (a process that ended without a word:
      killed, out of memory).
    * Any other error: each failing process counts itself, then (the main process at
      once, the others after ``SAME_FAILURE_WAIT``) the first to claim the error's text
      says it. An error every process had is said without a process number; one
      process's own names it (``on process 1 of 2``).

    Without a launch store every failing process speaks for itself, naming itself."""
    rank, world = launch_rank()
    if is_collective_failure(error):
        store = _store.get()
        if store is not None and (_wait_for(lambda: _count("said") > 0, PEER_MESSAGE_WAIT)
                                  or _add("claimed/collective") != 1):
            return None  # the process that ended said why, or another waiting process says what it saw
        note_said()
        first_line = (str(error).splitlines() or [""])[0]
        return f"error on process {rank} of {world}: a collective operation failed ({type(error).__name__}: {first_line})"
    fingerprint = hashlib.sha1(text.encode()).hexdigest()[:16]
    if _add(f"seen/{fingerprint}") is None:
        return f"error on process {rank} of {world}: {text}"
    if rank == 0:
        _wait_for(lambda: _count(f"seen/{fingerprint}") >= world, SAME_FAILURE_WAIT)
    else:
        time.sleep(SAME_FAILURE_WAIT * 1.5)
    if _add(f"claimed/{fingerprint}") != 1:
        return None  # said by another process
    everyone = _count(f"seen/{fingerprint}") >= world
    note_said()
    return f"error: {text}" if everyone else f"error on process {rank} of {world}: {text}"
