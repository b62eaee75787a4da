"""Ctrl-C and SIGTERM as an orderly stop, taken at safe points.

A signal is recorded where it lands, never acted on there: the work stops at its next
safe point (``interrupt_point``; across the processes of a launch,
``processes.agreed_interrupt_point``, which every process reaches at the same place in
its work), where an ``Interrupted`` exception (a ``KeyboardInterrupt``) unwinds through
code that keeps what is complete (a checkpoint, finished runs) and says so; ``leaf``
then exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) after one
line on stderr. Nothing is raised inside a collective, an import or a library's C++
callback, so a stop never leaves processes of a launch waiting on each other.

Signals of the same stop arrive more than once: a terminal sends Ctrl-C to the whole
process group, launcher included, and ``torchrun`` then relays it to its workers; a
scheduler signals every process of a job. Signals within ``GRACE_SECONDS`` of the first
are that same stop. A later one is a second request, and the process exits at once
(``os._exit``): a watcher thread sees it even while the main thread is blocked in a
collective or a long kernel, where Python runs no signal handler. Checkpoints are
written to a temporary directory and renamed, so an exit at any instant leaves only
complete ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator

__all__ = ["Interrupted", "stop_on_signals", "interrupt_point", "received", "exit_status", "INTERRUPT_SIGNALS",
           "GRACE_SECONDS"]

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

GRACE_SECONDS = 2.0
"""Signals arriving within this many seconds of the first are the same stop (relayed by
a launcher or sent to a whole process group); a later one exits at once."""


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


class _Stop:
    """What this process has received: the first signal, as the ``Interrupted`` that
    safe points raise. Written by the main thread's handler and the watcher thread
    (whichever sees the signal first); read by the main thread."""

    def __init__(self) -> None:
        self.first: Interrupted | None = None
        self.active = False  # inside stop_on_signals
        self.label = "leaf"  # the command, in the line an exit at once prints

    def record(self, signal_number: int) -> None:
        if self.first is None:
            self.first = Interrupted(signal_number)


_stop = _Stop()


def received() -> Interrupted | None:
    """The ``Interrupted`` of the first signal received inside ``stop_on_signals``, if
    one was. Code that turns exceptions into something else (a plugin loader that skips
    a plugin whose import failed, the command line's error report) asks this to report
    an interrupt as what it is."""
    return _stop.first


def interrupt_point() -> None:
    """A safe point of work that only this process does: raise the ``Interrupted`` of
    the signal received, if one was. Work that several processes of a launch do
    together uses ``processes.agreed_interrupt_point`` instead, so that all stop at the
    same point."""
    if _stop.first is not None:
        raise _stop.first


def _exit_at_once(signal_number: int) -> None:
    """A second request: one line (from the launch's main process), then exit."""
    if os.environ.get("RANK", "0") == "0":
        name = signal.Signals(signal_number).name
        os.write(2, f"{_stop.label}: second {name}: stopped at once (checkpoints are complete or absent; run the "
                    f"same command to resume)\n".encode())
    os._exit(128 + signal_number)


class _Watcher(threading.Thread):
    """Reads the signal numbers Python's C-level handler writes to the wakeup pipe, as
    they arrive, whatever the main thread is doing: the first is recorded, a later one
    after ``GRACE_SECONDS`` exits the process."""

    def __init__(self, read_end: int) -> None:
        super().__init__(name="leaf-signal-watcher", daemon=True)
        self.read_end = read_end
        self.first_at: float | None = None

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.read_end, 64)
            except OSError:
                return
            if not data:  # the write end was closed: the block is over
                return
            for number in data:
                self.arrived(number)

    def arrived(self, signal_number: int) -> None:
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
            _stop.record(signal_number)
        elif now - self.first_at >= GRACE_SECONDS:
            _exit_at_once(signal_number)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_on_signals(label: str = "leaf", restore: bool = True) -> Iterator[None]:
    """Record SIGINT and SIGTERM inside the block (``interrupt_point`` raises them at the
    work's safe points; a repeat after ``GRACE_SECONDS`` exits at once). On exit the
    previous handlers are restored, or, with ``restore=False`` (a process that exits
    right after the block), both signals are ignored from then on, so that a signal
    arriving once the work is done cannot kill the process on its way out. A signal the
    process was started ignoring (a background job of a script ignores SIGINT) stays
    ignored. Blocks nest (an inner one changes nothing); outside the main thread it does
    nothing (Python delivers signals to the main thread only).

    :param label: what the line of an exit at once starts with (``leaf train``).
    """
    if not _in_main_thread() or _stop.active:
        yield
        return
    watched = [number for number in INTERRUPT_SIGNALS if signal.getsignal(number) is not signal.SIG_IGN]
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    watcher = _Watcher(read_end)
    try:
        previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not possible here (an embedding interpreter): the handler alone records
        previous_wakeup, watcher = None, None
    previous = {number: signal.signal(number, _handler(watcher)) for number in watched}
    if watcher is not None:
        watcher.start()
    _stop.first, _stop.active, _stop.label = None, True, label
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if restore else signal.SIG_IGN)
        if previous_wakeup is not None:
            signal.set_wakeup_fd(previous_wakeup)
        os.close(write_end)
        if watcher is not None:
            watcher.join(timeout=1.0)
        os.close(read_end)
        _stop.first, _stop.active = None, False


def _handler(watcher: _Watcher | None) -> Any:
    """The Python-level handler: it records the signal (so that the next line of the
    main thread sees it, without waiting for the watcher thread); without a watcher it
    also exits at once on a repeat after the grace period."""
    arrivals: list[float] = []

    def handle(signal_number: int, _frame: Any) -> None:
        _stop.record(signal_number)
        if watcher is None:
            arrivals.append(time.monotonic())
            if arrivals[-1] - arrivals[0] >= GRACE_SECONDS:
                _exit_at_once(signal_number)

    return handle


def _reset_in_child() -> None:
    """A forked child does not inherit the watcher thread: it gets the default
    handlers and no wakeup pipe of its parent's."""
    if not _stop.active:
        return
    _stop.first, _stop.active = None, False
    with contextlib.suppress(ValueError):  # ValueError: forked from a thread other than the main one
        signal.set_wakeup_fd(-1)
        for number in INTERRUPT_SIGNALS:
            if signal.getsignal(number) is not signal.SIG_IGN:
                signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
