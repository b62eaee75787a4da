"""Checkpoints that a re-run resumes from exactly: adapter, optimizer, every process's
RNG states, step; on the same hardware or on other hardware.

A checkpoint ``checkpoint-<step>/`` holds:

* ``adapter/``: the LoRA adapter in peft's format (``adapter_model.safetensors``,
  ``adapter_config.json``, as ``save_pretrained`` writes it), whole, written by the main
  process; evaluation and users load it with ``PeftModel.from_pretrained``;
* ``trained/``: a ``torch.distributed.checkpoint`` (DCP) of the adapter and the
  optimizer's states, keyed by parameter name. Each process writes what it holds (its
  shards under ``sharding: fsdp2``; a replicated tensor is written once), and a resume
  reads into whatever the run holds now: another process count, sharded or not (DCP
  reshards on load), so the hardware may change between resumes;
* ``state.pt``: the step, the process count, the sharding and the learning-rate
  schedule's state;
* ``rng-rank<r>.pt``: the Python, NumPy and torch RNG states of process ``r``, one file
  per process;
* ``plugins/<name>.pt``: the state of each plugin named in ``plugins:`` that returns one
  from its ``save_plugin_state`` hook (written by the main process, read by every
  process on resume).

Every process writes into ``.partial-<step>/``; after all have written (a barrier) the
main process fsyncs it and renames it to ``checkpoint-<step>``, so a kill of any process
at any instant leaves only complete checkpoints (a ``.partial-*`` left behind is removed
at the next save or start). The newest ``keep`` checkpoints are kept, the older ones
deleted after the rename.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.training.durable import fsync_directory, fsync_tree
from leaf_plugins.training.optimization import inner_optimizer
from leaf_plugins.training.sharding import is_sharded

__all__ = ["KEEP_ALL", "keep_checkpoints_problem", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "remove_partials", "PLUGIN_STATES", "plugin_state_file", "load_plugin_states"]

TRAINED = "trained"
"""The directory of a checkpoint holding the adapter's and the optimizer's states (DCP)."""

PLUGIN_STATES = "plugins"
"""The directory of a checkpoint holding the named plugins' own states."""

KEEP_ALL = "all"
"""``keep_checkpoints: all``: no checkpoint is deleted."""


def keep_checkpoints_problem(value: Any) -> str | None:
    """The config validator of ``keep_checkpoints``: an integer >= 1 or ``all``."""
    if value == KEEP_ALL or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return (f"must be an integer >= 1 (the newest N checkpoints are kept) or '{KEEP_ALL}' (none is deleted), "
            f"got {value!r}")


class _Processes:
    """The run's processes as checkpointing sees them: this one's index, their count, a
    barrier. Without an accelerator: one process."""

    def __init__(self, accelerator: Any | None) -> None:
        self.accelerator = accelerator
        self.rank = accelerator.process_index if accelerator is not None else 0
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.main = self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()


def save_checkpoint(directory: Path, step: int, model: Any, optimizer: torch.optim.Optimizer,
                    accelerator: Any | None = None, scheduler: Any | None = None, keep: int | str = 1,
                    plugin_states: Mapping[str, Any] | None = None) -> Path:
    """Write ``checkpoint-<step>`` atomically and keep the newest ``keep`` checkpoints
    (``KEEP_ALL``: all). Called by every process of the run at once (it synchronises
    them, and makes the same collectives on each); ``model`` is the PeftModel,
    FSDP2-sharded or not. A step is written once: when
    ``checkpoint-<step>`` exists already (complete, since only a finished write has that
    name) it is kept as it is. Half-written ``.partial-*`` directories of earlier, killed
    writes are removed first.

    :param accelerator: the run's ``Accelerator`` (its process index and count, and the
        barrier); None: a single process.
    :param scheduler: the run's learning-rate schedule (``optimization.build_schedule``).
    :param plugin_states: plugin name -> its state (``save_plugin_state``), written by
        the main process into ``plugins/`` (``plugin_state_file``).
    """
    processes = _Processes(accelerator)
    target = directory / f"checkpoint-{step:08d}"
    processes.barrier()  # every process has finished the step, and nobody writes yet
    if target.is_dir():
        return target
    partial = directory / f".partial-{step:08d}"
    if processes.main:
        remove_partials(directory)
        partial.mkdir(parents=True)
    processes.barrier()  # the directory exists for every process
    sharded = is_sharded(model)
    _save_adapter(partial / "adapter", model, processes.main)
    _save_trained(partial / TRAINED, model, optimizer, processes.world)
    if processes.main:
        state = {"step": step, "world_size": processes.world, "sharding": "fsdp2" if sharded else "none",
                 **({"scheduler": scheduler.state_dict()} if scheduler is not None else {})}
        torch.save(state, partial / "state.pt")
        for name, plugin_state in (plugin_states or {}).items():
            (partial / PLUGIN_STATES).mkdir(exist_ok=True)
            torch.save(plugin_state, partial / plugin_state_file(name))
    torch.save(_rng_state(), partial / f"rng-rank{processes.rank}.pt")
    processes.barrier()  # every process's files are written
    if processes.main:
        fsync_tree(partial)  # the content is on disk before the name says it is complete
        partial.rename(target)
        fsync_directory(directory)
        _prune(directory, target, keep)
    processes.barrier()  # the checkpoint exists for every process
    return target


def plugin_state_file(name: str) -> str:
    """The path of plugin ``name``'s state in a checkpoint (relative to it)."""
    return f"{PLUGIN_STATES}/{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.pt"


def load_plugin_states(path: Path, names: Iterable[str]) -> dict[str, Any]:
    """The states the checkpoint ``path`` holds of the plugins ``names`` (a plugin
    without a saved state is left out)."""
    files = {name: Path(path) / plugin_state_file(name) for name in names}
    return {name: torch.load(file, weights_only=False) for name, file in files.items() if file.exists()}


def _save_adapter(target: Path, model: Any, main: bool) -> None:
    """The adapter, whole, in peft's format (the main process writes it; a sharded one is
    gathered first, on every process)."""
    if not is_sharded(model):
        if main:
            model.save_pretrained(target)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                  ignore_frozen_params=True))  # on the main process
    if main:
        model.save_pretrained(target, state_dict=whole)


def _trained_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The adapter's and the optimizer's states as this process holds them, keyed by
    parameter name (the frozen base is not in it: it comes from the backbone)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=True)),
            "optimizer": get_optimizer_state_dict(model, inner_optimizer(optimizer))}


def _save_trained(target: Path, model: Any, optimizer: torch.optim.Optimizer, world: int) -> None:
    """What this process holds of the adapter and the optimizer, into the DCP ``target``."""
    import torch.distributed.checkpoint as dcp

    with _one_process_quietly():
        dcp.save(_trained_state(model, optimizer), checkpoint_id=target, no_dist=world == 1)


@contextlib.contextmanager
def _one_process_quietly() -> Iterator[None]:
    """DCP warns at every save and load of a single process that it assumes one process
    (the run has one: nothing to warn about)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _prune(directory: Path, target: Path, keep: int | str) -> None:
    """Delete the checkpoints older than ``target`` beyond the newest ``keep`` (``target`` counted)."""
    if keep == KEEP_ALL:
        return
    older = sorted(path for path in directory.glob("checkpoint-*") if path.name < target.name)
    for old in older[: max(len(older) - (int(keep) - 1), 0)]:
        shutil.rmtree(old)


def _rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch (and CUDA, where present) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def remove_partials(directory: Path) -> None:
    """Delete the ``.partial-*`` directories of checkpoint writes that a kill cut short."""
    for partial in directory.glob(".partial-*"):
        shutil.rmtree(partial, ignore_errors=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, if any."""
    found = sorted(directory.glob("checkpoint-*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer, accelerator: Any | None = None,
                    scheduler: Any | None = None) -> int:
    """Restore adapter weights, optimizer, learning-rate schedule and this process's RNG
    states; return the step reached. Called by every process at once. The adapter and
    optimizer states are read into what the run holds now, whatever the process count
    and sharding of the run that wrote them (DCP reshards); a process that the writing
    run did not have keeps its seeded RNG states.

    :raises ConfigError: for a checkpoint of leaf-plugins 0.1.0 (another layout)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    processes = _Processes(accelerator)
    if not (path / TRAINED).is_dir():
        raise ConfigError(f"{path} has no {TRAINED}/: it was written by leaf-plugins 0.1.0, whose checkpoints this "
                          f"version does not read. Resume the run with 0.1.0, or start it again in another output_dir")
    state = torch.load(path / "state.pt", weights_only=False)
    trained = _trained_state(model, optimizer)
    with _one_process_quietly():
        dcp.load(trained, checkpoint_id=path / TRAINED, no_dist=processes.world == 1)  # in place; a missing key fails
    # not strict: the frozen base weights are not in the checkpoint (they come from the backbone)
    set_model_state_dict(model, trained["model"], options=StateDictOptions(ignore_frozen_params=True, strict=False))
    set_optimizer_state_dict(model, inner_optimizer(optimizer), trained["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    own = path / f"rng-rank{processes.rank}.pt"
    if own.exists():  # absent: the run had fewer processes, this one starts from its seeded RNG
        _set_rng_state(torch.load(own, weights_only=False))
    return int(state["step"])
