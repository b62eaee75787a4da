"""What a run's numbers depend on beyond its config and seeds: the torch build, its CPU
kernels (ISA, BLAS), the thread count (and why it is that: ``training/threads.py``), the
GPU and espeak-ng (which voices the built-in tasks). Recorded in ``environment.json`` when
a run starts; a resume under another environment warns that the rest of the run will not
be bit-identical."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import warnings
from functools import lru_cache
from pathlib import Path

import torch

from leaf_plugins.training.durable import replace_text

__all__ = ["ENVIRONMENT", "environment", "record_environment", "EnvironmentChangedWarning"]

ENVIRONMENT = "environment.json"
EXPLANATIONS = ("threads_reason",)  # recorded, not compared: they say why, not what


class EnvironmentChangedWarning(UserWarning):
    """A run resumed under another environment than the one it started in."""


def environment() -> dict[str, object]:
    """The facts of this process that change floating-point results or the data."""
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the ISA of torch's own CPU kernels
        "blas": "mkl" if torch.backends.mkl.is_available() else "other",
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "espeak_ng": _espeak_version(),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def _espeak_version() -> str | None:
    if shutil.which("espeak-ng") is None:
        return None
    done = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True)
    return done.stdout.strip() or None


def record_environment(output_dir: Path, threads_reason: str | None = None) -> None:
    """Write ``environment.json`` at a run's start (with ``threads_reason``, why the run
    has its thread count); on a resume compare with it and warn
    (``EnvironmentChangedWarning``) naming what changed."""
    path = Path(output_dir) / ENVIRONMENT
    current = environment()
    if not path.exists():
        if threads_reason is not None:
            current["threads_reason"] = threads_reason
        replace_text(path, json.dumps(current, indent=1))
        return
    held = json.loads(path.read_text())
    changed = [f"{key}: {held.get(key)!r} -> {value!r}" for key, value in current.items()
               if key not in EXPLANATIONS and held.get(key) != value]
    if changed:
        warnings.warn(f"{path}: this run resumes under another environment ({'; '.join(changed)}); its remaining "
                      f"steps will not be bit-identical to those of an uninterrupted run", EnvironmentChangedWarning,
                      stacklevel=2)
