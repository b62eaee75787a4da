"""Ctrl-C and SIGTERM as an orderly stop: the signal becomes an ``Interrupted`` exception
(a ``KeyboardInterrupt``) at a safe point, the code it unwinds through keeps what is
complete (a checkpoint, finished runs) and says so, and ``leaf`` exits with 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM) after one line on stderr.

Two pieces:

- ``interrupts_as_exceptions()`` (``leaf``'s ``main``): SIGINT and SIGTERM raise
  ``Interrupted`` in the main thread. Only the first signal raises: signals arriving
  while the program winds down (saving what it keeps) are ignored, so a second Ctrl-C
  cannot tear the save it is waiting for (``kill -9`` still stops it at once; a kill
  loses at most the steps since the last checkpoint).
- ``deferred_interrupts()``: a block that must not be cut in two (an optimizer step and
  the log line that records it, a checkpoint write) holds SIGINT and SIGTERM and
  delivers them, to whatever handler was installed before, when it ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

__all__ = ["Interrupted", "interrupts_as_exceptions", "deferred_interrupts", "interrupt_received", "INTERRUPT_SIGNALS",
           "exit_status"]

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived. ``kept`` says what the interrupted work saved (set by
    the code it unwinds through; None: nothing beyond what was already on disk)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number
        self.kept: str | None = None


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process stopped by this interrupt's signal: 128 + its
    number (a plain ``KeyboardInterrupt`` counts as SIGINT: 130)."""
    return 128 + getattr(interrupt, "signal_number", signal.SIGINT)


_received: list[Interrupted] = []  # the interrupt raised inside interrupts_as_exceptions, if any


def interrupt_received() -> Interrupted | None:
    """The ``Interrupted`` raised since ``interrupts_as_exceptions`` began, if one was.
    Code that turns exceptions into something else (a plugin loader that skips a plugin
    whose import failed, a library that wraps import errors) asks this to let an
    interrupt through as what it is."""
    return _received[0] if _received else None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupts_as_exceptions(restore: bool = True) -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` (once) inside the block; the previous
    handlers are restored after it, or, with ``restore=False`` (a process that exits
    right after the block), both are ignored from then on, so that a signal arriving
    once the work is done cannot kill the process on its way out. A signal the process
    was started ignoring (a background job of a script ignores SIGINT) stays ignored.
    Outside the main thread it does nothing (Python delivers signals to the main thread
    only)."""
    if not _in_main_thread():
        yield
        return
    def handle(signal_number: int, _frame: Any) -> None:
        if _received:
            return  # winding down after the first one: let the save finish
        _received.append(Interrupted(signal_number))
        raise _received[0]

    _received.clear()
    previous = {number: signal.signal(number, handle) for number in INTERRUPT_SIGNALS
                if signal.getsignal(number) is not signal.SIG_IGN}  # an ignored signal stays ignored (`cmd &` in a script)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if restore else signal.SIG_IGN)
        _received.clear()


_held: list[int] = []  # signals that arrived inside the outermost deferred block
_depth = [0]


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the length of the block, then deliver the first one
    that arrived (to the handler in place before: ``Interrupted`` under ``leaf``, a
    ``KeyboardInterrupt`` or termination otherwise). Blocks nest; the outermost one
    delivers. If the block itself raises, that error propagates and the held signal is
    dropped (the error stops the program already)."""
    if not _in_main_thread():
        yield
        return
    _depth[0] += 1
    previous = None
    if _depth[0] == 1:
        _held.clear()
        previous = {number: signal.signal(number, lambda number, _frame: _held.append(number))
                    for number in INTERRUPT_SIGNALS}
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        _depth[0] -= 1
        if previous is not None:
            for number, handler in previous.items():
                signal.signal(number, handler)
            if _held and not failed:
                signal.raise_signal(_held[0])  # the restored handler runs now (raising, if it raises)
