"""``report_to``: a run's metrics reach TensorBoard, Weights & Biases (offline), MLflow
(a local file store) and trackio (a local database) as ``metrics.jsonl`` has them, each
read back with the tracker's own reader; a tracker whose package is missing is refused
before the model loads."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.training.trackers import PROJECT_NAME, check_trackers

REPOSITORY = Path(__file__).resolve().parents[1]
FLOAT32 = 1e-6
"""TensorBoard keeps a scalar as float32 (about 6e-8 relative); the others keep float64."""


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """A two-step run of the built-in backbone reporting to every tracker."""
    for package in ("tensorboard", "wandb", "mlflow", "trackio"):
        if importlib.util.find_spec(package) is None:
            pytest.fail(f"{package} is not installed: pip install -e '.[trackers]' (scripts/install.sh does)")
    root = tmp_path_factory.mktemp("tracked")
    environment = {**os.environ, "WANDB_MODE": "offline", "TRACKIO_DIR": str(root / "trackio"),
                   "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    environment.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "leaf_plugins.cli", "train", "configs/runs/tiny-qwen2-audio.yaml",
                           "steps=2", f"output_dir={root / 'run'}", "report_to=[tensorboard,wandb,mlflow,trackio]",
                           "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6"],
                          capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same(found: dict[int, dict[str, float]], expected: list[dict], relative: float = 1e-12) -> None:
    """Every step's every metric of ``metrics.jsonl`` in ``found`` (step -> name -> value)."""
    assert sorted(found) == [entry["step"] for entry in expected]
    for entry in expected:
        for name, value in entry.items():
            if name != "step":
                assert found[entry["step"]][name] == pytest.approx(value, rel=relative, abs=1e-12), \
                    (name, entry["step"])


def test_tensorboard_has_every_metric(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked_run / "run" / PROJECT_NAME))
    events.Reload()
    found: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            found.setdefault(event.step, {})[tag] = event.value
    assert_same(found, logged(tracked_run / "run"), FLOAT32)


def wandb_history(run_file: str) -> list[dict]:
    """The history rows of an offline W&B run file: a LevelDB-style log (32 KiB blocks of
    records with a 7-byte header: CRC, length, type full/first/middle/last) after W&B's
    7-byte file header, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data, block, position = Path(run_file).read_bytes(), 32768, 7
    assert data.startswith(b":W&B")
    records, pending = [], b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def test_wandb_offline_run_has_every_metric(tracked_run):
    (run_file,) = glob.glob(str(tracked_run / "run" / "wandb" / "offline-run-*" / "run-*.wandb"))
    found = {row["_step"]: row for row in wandb_history(run_file)}
    assert_same(found, logged(tracked_run / "run"))


def test_mlflow_file_store_has_every_metric_and_the_config(tracked_run):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(tracked_run / "run" / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name(PROJECT_NAME)
    (run,) = client.search_runs([experiment.experiment_id])
    expected = logged(tracked_run / "run")
    found: dict[int, dict[str, float]] = {}
    for name in expected[0]:
        if name != "step":
            for point in client.get_metric_history(run.info.run_id, name):
                found.setdefault(point.step, {})[name] = point.value
    assert_same(found, expected)
    assert run.data.params["estimator.name"] == "leaf" and run.data.params["steps"] == "2"


def test_trackio_database_has_every_metric(tracked_run):
    with sqlite3.connect(tracked_run / "trackio" / f"{PROJECT_NAME}.db") as database:
        rows = database.execute("select step, metrics from metrics where run_name = 'run'").fetchall()
    assert_same({step: json.loads(metrics) for step, metrics in rows}, logged(tracked_run / "run"))


def test_a_tracker_without_its_package_is_refused_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"report_to names wandb, whose package is not installed: "
                                          r"pip install 'leaf-plugins\[trackers\]'"):
        check_trackers(["tensorboard", "wandb"])


def test_a_tracker_the_installed_accelerate_lacks_is_refused(monkeypatch):
    from accelerate import tracking

    monkeypatch.setattr(tracking, "LOGGER_TYPE_TO_CLASS", {k: v for k, v in tracking.LOGGER_TYPE_TO_CLASS.items()
                                                            if k != "trackio"})
    with pytest.raises(ConfigError, match=r"report_to names trackio, which accelerate [\d.]+ cannot report to: "
                                          r"pip install -U accelerate"):
        check_trackers(["tensorboard", "trackio"])
    check_trackers(["tensorboard"])
