"""A training run's directory read back, for ``leaf runs``: which directories under a folder
are runs, their ``metrics.jsonl``, where each run stands, and their metrics side by side.

A run directory (``leaf train``'s ``output_dir``) holds ``config.yaml`` (the resolved run
config) and, once the run has started training, ``status.json`` (``run_status``) and
``metrics.jsonl`` (one JSON object per logged step); a study's runs lie one or more levels
down its output folder (``runs/<variation>/seed-<n>/``). Everything here reads files
only and needs none of the ``train`` extra.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from leaf_plugins.core.errors import ConfigError, ConfigNotice, suggest
from leaf_plugins.training.run_status import RUN_STATUS, STATES, RunStatus, read_status

__all__ = ["METRICS_LOG", "RUN_CONFIG", "SHOWN_STATES", "RunSummary", "Comparison", "is_run_directory",
           "find_runs", "read_metrics", "read_run_config", "shown_state", "summarise", "run_names", "compare",
           "metric_series"]

METRICS_LOG = "metrics.jsonl"
"""The run's per-step metrics, as the trainer appends them."""

RUN_CONFIG = "config.yaml"
"""The resolved run config (``training.run_config.RUN_CONFIG``, named again here because
that module imports the training stack)."""

SHOWN_STATES = (*STATES, "stopped", "unknown")
"""What ``leaf runs`` says of a run: a ``status.json`` state (``run_status.STATES``);
``stopped``, a ``running`` run whose process no longer runs on this host (killed outright);
``unknown``, a run without a readable ``status.json`` (older runs, or one that never
started training)."""


@dataclass(frozen=True)
class RunSummary:
    """One run directory, as a row of ``leaf runs FOLDER``."""

    path: Path
    estimator: str | None  # config.yaml's estimator.name
    done: int  # the last logged step (status.json's step when nothing is logged)
    planned: int | None  # status.json's steps, else config.yaml's
    reward_mean: float | None  # of the last logged step
    state: str  # one of SHOWN_STATES


@dataclass(frozen=True)
class Comparison:
    """Runs' metrics at one step each: a row per metric, a column per run."""

    names: list[str]  # the runs, as their columns are headed (``run_names``)
    steps: list[int]  # the step each run's values are from
    metrics: list[str]  # the metrics every run logged at that step, in the first run's order
    values: list[list[Any]]  # [metric][run]
    partial: list[str]  # metrics some runs logged at that step and others not: left out
    wall_clock: list[str]  # wall-clock metrics left out (compare(..., wall_clock=False))


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` is a training run's directory: it holds ``config.yaml`` and
    ``metrics.jsonl`` or ``status.json``."""
    path = Path(path)
    return (path / RUN_CONFIG).is_file() and ((path / METRICS_LOG).is_file() or (path / RUN_STATUS).is_file())


def find_runs(folder: Path) -> list[Path]:
    """The run directories at or below ``folder``, sorted by path (a run's own
    subdirectories, its checkpoints, and hidden directories are not searched).

    :raises ConfigError: ``folder`` is not a directory."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such directory")
    found = []
    for directory, subdirectories, _ in os.walk(folder):
        if is_run_directory(Path(directory)):
            found.append(Path(directory))
            subdirectories.clear()
        else:
            subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
    return sorted(found, key=lambda path: path.parts)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The records of the run's ``metrics.jsonl``, one per logged step, in order. An
    unparsable last line (a write cut short by a kill, or one in progress) is left out
    with a ``ConfigNotice``.

    :raises ConfigError: the file is missing, or a line before the last is not a JSON
        object with an integer ``step`` (naming ``file:line``)."""
    path = Path(run) / METRICS_LOG
    if not path.is_file():
        raise ConfigError(f"{run}: no {METRICS_LOG} (not a leaf train output directory, or no step logged yet)")
    lines = [(number, line) for number, line in enumerate(path.read_text().split("\n"), start=1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(lines) - 1:
                warnings.warn(f"{path}:{number}: left out its unparsable last line (a write cut short by a kill, "
                              "or one in progress)", ConfigNotice, stacklevel=2)
                break
            raise ConfigError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from error
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError(f"{path}:{number}: not a step's metrics (a JSON object with an integer step)")
        records.append(record)
    return records


def read_run_config(run: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` as plain data.

    :raises ConfigError: the file is missing, is not YAML, or is not a mapping."""
    from ruamel.yaml import YAML, YAMLError

    path = Path(run) / RUN_CONFIG
    if not path.is_file():
        raise ConfigError(f"{run}: no {RUN_CONFIG} (not a leaf train output directory)")
    try:
        data = YAML(typ="safe", pure=True).load(path.read_text())
    except YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run config (a mapping of keys), got {type(data).__name__}")
    return data


def shown_state(status: RunStatus | None) -> str:
    """What ``leaf runs`` calls a run with ``status`` (one of ``SHOWN_STATES``): a
    ``running`` status whose process is gone from this host is ``stopped``; a status on
    another host is taken as written (its process cannot be checked from here)."""
    if status is None or status.state not in STATES:
        return "unknown"
    if status.state == "running" and status.host == socket.gethostname() and not _alive(status.pid):
        return "stopped"
    return status.state


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    except (OverflowError, ValueError):  # not a process id
        return False
    return True


def summarise(run: Path) -> RunSummary:
    """The row of one run directory. Without ``status.json`` the state is ``unknown`` and
    the planned steps are ``config.yaml``'s."""
    config = read_run_config(run)
    status = read_status(run)
    records = read_metrics(run) if (Path(run) / METRICS_LOG).is_file() else []
    done = records[-1]["step"] if records else (status.step if status is not None else 0)
    planned = status.steps if status is not None else config.get("steps")
    estimator = config.get("estimator")
    name = estimator.get("name") if isinstance(estimator, dict) else None
    reward = records[-1].get("reward_mean") if records else None
    return RunSummary(Path(run), name if isinstance(name, str) else None, done,
                      planned if isinstance(planned, int) else None,
                      reward if isinstance(reward, (int, float)) else None, shown_state(status))


def run_names(runs: Sequence[Path]) -> list[str]:
    """Short names of ``runs`` that still tell them apart: their paths without the
    directories all of them share (a single run: its directory's name)."""
    parts = [Path(run).parts for run in runs]
    shared = 0
    while all(len(p) > shared + 1 for p in parts) and len({p[shared] for p in parts}) == 1:
        shared += 1
    if len(runs) == 1:
        shared = len(parts[0]) - 1
    return [str(Path(*p[shared:])) for p in parts]


def _record_at(run: Path, records: list[dict[str, Any]], step: int | None) -> dict[str, Any]:
    """The record of ``step`` in a run's log (None: its last one)."""
    if not records:
        raise ConfigError(f"{Path(run) / METRICS_LOG}: no step logged yet")
    if step is None:
        return records[-1]
    for record in reversed(records):
        if record["step"] == step:
            return record
    raise ConfigError(f"{Path(run) / METRICS_LOG}: no step {step}; it logged steps {records[0]['step']} to "
                      f"{records[-1]['step']}")


def compare(runs: Sequence[Path], step: int | None = None, wall_clock: bool = False) -> Comparison:
    """The runs' metrics at ``step`` (None: each run's last logged step): every metric that
    all of them logged there, the wall-clock ones (``step_metrics.WALL_CLOCK_METRICS``)
    only with ``wall_clock``.

    :raises ConfigError: a run has no ``metrics.jsonl``, nothing logged, or no ``step``."""
    if step is not None and step < 1:
        raise ConfigError(f"--step counts from 1 (the first logged step), got {step}")
    chosen = [_record_at(run, read_metrics(run), step) for run in runs]
    logged = [name for name in chosen[0] if name != "step"]
    everywhere = [name for name in logged if all(name in record for record in chosen)]
    partial = sorted({name for record in chosen for name in record if name != "step"} - set(everywhere))
    left_out: list[str] = []
    if not wall_clock:
        from leaf_plugins.training.step_metrics import WALL_CLOCK_METRICS  # torch, which `leaf` has loaded already

        left_out = [name for name in everywhere if name in WALL_CLOCK_METRICS]
    metrics = [name for name in everywhere if name not in left_out]
    return Comparison(run_names(runs), [record["step"] for record in chosen], metrics,
                      [[record[name] for record in chosen] for name in metrics], partial, left_out)


def metric_series(logs: Mapping[str, Iterable[Mapping[str, Any]]], metric: str) -> dict[str, tuple[list[int],
                                                                                                   list[float]]]:
    """``(steps, values)`` of ``metric`` for each run of ``logs`` (name -> its records) that
    logged a number for it at some step; a run that never did is left out.

    :raises ConfigError: no run logged ``metric``, with the closest names and every metric
        the runs logged."""
    logs = {name: list(records) for name, records in logs.items()}
    series = {}
    for name, records in logs.items():
        points = [(record["step"], record[metric]) for record in records
                  if isinstance(record.get(metric), (int, float)) and not isinstance(record.get(metric), bool)]
        if points:
            series[name] = ([step for step, _ in points], [value for _, value in points])
    if not series:
        known = sorted({key for records in logs.values() for record in records for key in record} - {"step"})
        said = "a number for the metric" if metric in known else "the metric"
        raise ConfigError(f"no run logged {said} {metric!r}.{suggest(metric, known)} "
                          f"Their metrics: {', '.join(known) or 'none (nothing logged yet)'}")
    return series
