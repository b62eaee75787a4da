"""Prediction files: JSONL, one item per line, read with errors that name file:line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.jsonl import read_jsonl

__all__ = ["PredictionFile", "read_predictions", "write_predictions", "prediction_file"]


@dataclass(frozen=True)
class PredictionFile:
    """The items of one prediction run, in file order."""

    path: Path
    ids: list[str]
    predictions: list[str]
    references: list[str]
    questions: list[str]
    scores: list[float] | None  # the per-item score column, when one was asked for


def read_predictions(
    path: str | Path,
    prediction_key: str = "prediction",
    reference_key: str = "reference",
    question_key: str = "question",
    id_key: str = "id",
    score_key: str | None = None,
) -> PredictionFile:
    """Read a JSONL prediction file: one object per line with ``prediction_key`` and
    ``reference_key`` strings, optionally ``id_key`` (default: the line number),
    ``question_key`` and a numeric ``score_key`` (required when given)."""
    path = Path(path)
    ids, predictions, references, questions, scores = [], [], [], [], []
    for number, record in read_jsonl(path, "prediction file"):
        where = f"{path}:{number}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in (prediction_key, reference_key):
            if not isinstance(record.get(key), str):
                known = ", ".join(sorted(record)) or "(none)"
                raise ConfigError(f"{where}: no string {key!r} (keys on this line: {known})")
        if score_key is not None:
            value = record.get(score_key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: {score_key!r} must be a number, got {value!r}")
            scores.append(float(value))
        ids.append(str(record.get(id_key, number)))
        predictions.append(record[prediction_key])
        references.append(record[reference_key])
        questions.append(str(record.get(question_key, "")))
    if not ids:
        raise ConfigError(f"prediction file {path} holds no items")
    return PredictionFile(path, ids, predictions, references, questions, scores if score_key else None)


def prediction_file(run: int) -> str:
    """The file name of decoding run ``run`` in an output directory."""
    return f"predictions-run{run}.jsonl"


def write_predictions(out_dir: str | Path, examples: Sequence, runs: Sequence[Sequence[str]]) -> list[Path]:
    """One JSONL file per decoding run (``id``, ``prediction``, ``reference``, and
    ``question``: the example's prompt), readable by ``read_predictions`` and
    ``leaf eval``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for run, predictions in enumerate(runs):
        path = out_dir / prediction_file(run)
        with path.open("w") as handle:
            for example, prediction in zip(examples, predictions):
                handle.write(json.dumps({"id": example.id, "prediction": prediction, "reference": example.reference,
                                         "question": example.prompt}, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
