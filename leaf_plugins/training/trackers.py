"""Where a run reports its metrics besides ``metrics.jsonl`` (``report_to``): the
trackers researchers read, through accelerate's tracking (the main process alone logs;
the resolved config is logged as the run's hyper-parameters).

* ``tensorboard``: event files under ``OUTPUT_DIR/leaf/`` (``tensorboard --logdir``);
* ``wandb``: a Weights & Biases run, its local files under ``OUTPUT_DIR/wandb``
  (``WANDB_MODE=offline`` keeps it local; ``wandb sync`` uploads it later);
* ``mlflow``: an MLflow run, in ``MLFLOW_TRACKING_URI`` when it is set, else a local file
  store in ``OUTPUT_DIR/mlruns`` (``mlflow ui --backend-store-uri OUTPUT_DIR/mlruns``);
* ``trackio``: a trackio run, in ``TRACKIO_DIR`` when it is set, else trackio's own.

Each tracker's package is an optional extra: ``pip install 'leaf-plugins[trackers]'``.
A run that names one whose package is missing is refused before its model loads.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Sequence

from leaf_plugins.core.errors import ConfigError

__all__ = ["TRACKERS", "TRACKERS_EXTRA", "check_trackers", "tracker_init_kwargs", "PROJECT_NAME"]

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
TRACKERS_EXTRA = "pip install 'leaf-plugins[trackers]'"
PROJECT_NAME = "leaf"
"""The project (tensorboard's subdirectory, wandb's and trackio's project, MLflow's experiment)."""


def check_trackers(report_to: Sequence[str]) -> None:
    """Refuse trackers whose package is not installed, naming them and the extra, and
    those the installed accelerate cannot drive (an older accelerate lacks trackio)."""
    missing = [name for name in report_to if importlib.util.find_spec(name) is None]
    if missing:
        packages = "packages are" if len(missing) > 1 else "package is"
        raise ConfigError(f"report_to names {', '.join(missing)}, whose {packages} "
                          f"not installed: {TRACKERS_EXTRA} (or pip install {' '.join(missing)})")
    if report_to:
        import accelerate
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        unknown = [name for name in report_to if name not in LOGGER_TYPE_TO_CLASS]
        if unknown:
            raise ConfigError(f"report_to names {', '.join(unknown)}, which accelerate {accelerate.__version__} cannot "
                              f"report to: pip install -U accelerate")


def tracker_init_kwargs(report_to: Sequence[str], output_dir: Path, run_name: str) -> dict[str, dict[str, Any]]:
    """accelerate's ``init_kwargs`` of the trackers ``report_to`` names: the run's name
    and, where a tracker keeps local files, the run's directory. MLflow gets a local file
    store in the run's directory unless ``MLFLOW_TRACKING_URI`` says otherwise."""
    kwargs: dict[str, dict[str, Any]] = {}
    if "wandb" in report_to:
        kwargs["wandb"] = {"dir": str(output_dir), "name": run_name}
    if "trackio" in report_to:
        kwargs["trackio"] = {"name": run_name}
    if "mlflow" in report_to:
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            import mlflow

            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's local store, kept for a local run
            mlflow.set_tracking_uri((Path(output_dir) / "mlruns").resolve().as_uri())
        kwargs["mlflow"] = {"run_name": run_name}
    return kwargs
