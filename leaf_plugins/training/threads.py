"""How many threads torch's CPU operators use in a run (``threads`` in the run config).

By default torch starts one intra-op thread per core of the machine. Every operator then
splits its work over all of them and waits for the slowest: when another process keeps
one of those cores busy, the thread placed there waits for the scheduler's next time
slice (milliseconds) in every operator, and a small model's step becomes many times
slower while the extra thread bought nothing when the machine was idle.

The rule (``choose_threads``), in this order:

1. ``threads: N`` in the run config (or ``threads=N`` on the command line): N.
2. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set in the environment, or
   ``torch.set_num_threads`` called before the trainer was built (a count other than the
   one torch started with): torch's count is kept as it is.
3. Otherwise, from the work and the cores this process may use:
   ``threads = clamp(floor(work / MIN_WORK_PER_THREAD), 1, cores)`` where ``work`` is the
   multiply-adds of one hidden x hidden projection over the rows a decode step carries
   (``2 * rows * hidden_size**2`` FLOPs, rows = this process's prompts per step x
   ``group_size``), ``MIN_WORK_PER_THREAD`` about a millisecond of one core's arithmetic,
   so a thread's share is worth the fork-join it costs, and ``cores`` the CPUs the
   process may run on (``os.sched_getaffinity``), capped by the cgroup's CPU quota
   (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us`` of v1, rounded
   down) and shared among the processes ``accelerate launch`` started on this machine
   (``LOCAL_WORLD_SIZE``).

The built-in tiny backbones (hidden size 48) get one thread; a 7B backbone (hidden size
4096) gets every usable core. The choice and its reason are recorded in the run's
``environment.json`` (``threads``, ``threads_reason``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["MIN_WORK_PER_THREAD", "ThreadChoice", "choose_threads", "usable_cores", "cgroup_cpu_quota",
           "step_work", "apply_threads", "hidden_size_of"]

MIN_WORK_PER_THREAD = 2e7
"""FLOPs a thread's share of one operator should have at least: about 1 ms of one core at
20 GFLOP/s (fp32, AVX2), large against a fork-join (microseconds on idle cores) and
comparable to a scheduler time slice, the wait a thread pays when its core is shared."""

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_STARTUP_THREADS = torch.get_num_threads()  # torch's own count when leaf first imported this module
_CHOSEN: list[int] = []  # the count apply_threads last set (not the caller's own)


@dataclass(frozen=True)
class ThreadChoice:
    """torch's intra-op thread count for a run and why it is that."""

    threads: int
    reason: str


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (``200000 100000`` in ``cpu.max``:
    2.0), or None when there is none (``max``) or no cgroup file says."""
    candidates: list[tuple[Path, str]] = []
    try:
        for line in membership.read_text().splitlines():
            hierarchy, _, path = line.split(":", 2)
            if hierarchy == "0":  # cgroup v2: 0::/path
                candidates.append((root / path.lstrip("/") / "cpu.max", "v2"))
            elif "cpu" in _.split(","):  # cgroup v1: N:cpu,cpuacct:/path
                candidates.append((root / "cpu" / path.lstrip("/") / "cpu.cfs_quota_us", "v1"))
    except (OSError, ValueError):
        pass
    candidates += [(root / "cpu.max", "v2"), (root / "cpu" / "cpu.cfs_quota_us", "v1"),
                   (root / "cpu,cpuacct" / "cpu.cfs_quota_us", "v1")]
    for path, version in candidates:
        try:
            if version == "v2":
                quota, period = path.read_text().split()[:2]
            else:
                quota, period = path.read_text().strip(), path.with_name("cpu.cfs_period_us").read_text().strip()
        except (OSError, ValueError):
            continue
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    return None


def usable_cores(affinity: int | None = None, quota: float | None | str = "read",
                 local_processes: int = 1) -> tuple[int, str]:
    """The cores this process may use and how that was found: the CPUs it may run on
    (``affinity``; default ``os.sched_getaffinity``), at most the cgroup quota rounded
    down (``quota`` in cores, None: no quota; default read from the cgroup), divided
    among ``local_processes`` processes on this machine; at least 1."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if quota == "read":
        quota = cgroup_cpu_quota()
    cores, how = affinity, f"{affinity} CPUs in the affinity mask"
    if quota is not None and math.floor(quota) < cores:
        cores, how = max(1, math.floor(quota)), f"cgroup CPU quota {quota:g} cores ({affinity} CPUs in the affinity mask)"
    if local_processes > 1:
        cores, how = max(1, cores // local_processes), f"{how}, shared by {local_processes} processes"
    return cores, how


def step_work(hidden_size: int, rows: int) -> float:
    """FLOPs of one hidden x hidden projection over ``rows`` rows (``2 * rows * hidden**2``)."""
    return 2.0 * rows * hidden_size * hidden_size


def choose_threads(configured: int | None, hidden_size: int | None, rows: int, cores: int, cores_how: str,
                   environ: Mapping[str, str] = os.environ, current: int | None = None,
                   startup: int | None = None, chosen: int | None = None) -> ThreadChoice:
    """The run's intra-op thread count by the rule of this module's docstring.
    ``current``/``startup``/``chosen``: torch's count now, when leaf was imported, and
    the one an earlier run in this process chose (defaults: read), to tell whether the
    caller set one with ``torch.set_num_threads``."""
    current = torch.get_num_threads() if current is None else current
    startup = _STARTUP_THREADS if startup is None else startup
    chosen = (_CHOSEN[-1] if _CHOSEN else None) if chosen is None else chosen
    if configured is not None:
        return ThreadChoice(configured, f"threads: {configured} in the run config")
    for name in THREAD_VARIABLES:
        if environ.get(name):
            return ThreadChoice(current, f"{name}={environ[name]} in the environment (torch's count kept)")
    if current not in (startup, chosen):
        return ThreadChoice(current, f"torch.set_num_threads({current}) called before the run (kept)")
    if hidden_size is None:
        return ThreadChoice(cores, f"the model's hidden size is unknown: every usable core ({cores_how})")
    work = step_work(hidden_size, rows)
    threads = max(1, min(cores, math.floor(work / MIN_WORK_PER_THREAD)))
    return ThreadChoice(threads, f"{work:.3g} FLOPs per projection (hidden size {hidden_size}, {rows} rows) at "
                                 f">= {MIN_WORK_PER_THREAD:.0e} per thread, at most {cores} usable cores ({cores_how})")


def hidden_size_of(model: Any) -> int | None:
    """The language model's hidden size from a transformers config (None if it has none)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "hidden_size", None)
    return int(size) if isinstance(size, int) else None


def apply_threads(configured: int | None, model: Any, rows: int) -> ThreadChoice:
    """Choose the run's thread count (``choose_threads``) for ``model`` and set it in torch."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cores, how = usable_cores(local_processes=local)
    choice = choose_threads(configured, hidden_size_of(model), rows, cores, how)
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
        _CHOSEN.append(choice.threads)
    return choice
