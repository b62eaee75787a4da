"""The authors' prepared format: ``datasets`` ``save_to_disk`` directories with rows
``{task, id, prompt, reference, audio, duration}`` (a ``DatasetDict`` of splits, or one
``save_to_disk`` directory per split)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leaf_plugins.tasks.audio import SAMPLING_RATE, AudioArray, AudioBytes, AudioFile
from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.examples import Record
from leaf_plugins.tasks.prompts import AUDIO, SOUND
from leaf_plugins.tasks.splits import held_out_split

__all__ = ["prepared_records", "SPLIT_ALIASES", "REQUIRED_COLUMNS"]

SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "dev", "val"), "test": ("test",)}
REQUIRED_COLUMNS = ("id", "prompt", "reference", "audio")


def prepared_records(directory: Path, split: str, validation_fraction: float) -> tuple[list[Record], str]:
    """Records of ``split`` and a description of where they came from. Without a
    validation split, validation is the held-out ``validation_fraction`` of train (by the
    stable hash of the id) and train is the rest."""
    splits = _available_splits(directory)
    if split == "validation" and split not in splits:
        rows = [r for r in _split_records(directory, splits, "train") if held_out_split(r.id, validation_fraction) == split]
        return rows, f"{directory} (held-out {validation_fraction:g} of train by id hash)"
    if split not in splits:
        raise DataError(f"{directory}: no {split!r} split (aliases {', '.join(SPLIT_ALIASES[split])}); "
                        f"found: {', '.join(sorted(splits)) or 'none'}")
    records = _split_records(directory, splits, split)
    if split == "train" and "validation" not in splits:
        records = [r for r in records if held_out_split(r.id, validation_fraction) == "train"]
        return records, f"{directory} (train minus the held-out {validation_fraction:g} for validation)"
    return records, str(directory)


def _available_splits(directory: Path) -> dict[str, Any]:
    """Our split name -> the ``datasets.Dataset`` loaded from disk (memory-mapped)."""
    import datasets

    if not directory.is_dir():
        raise DataError(f"{directory}: no such directory (expected a datasets save_to_disk directory)")
    if (directory / "dataset_dict.json").is_file():
        loaded = datasets.load_from_disk(str(directory))
        stored = {name: loaded[name] for name in loaded}
    else:
        stored = {child.name: child for child in sorted(directory.iterdir())
                  if child.is_dir() and (child / "state.json").is_file()}
        if not stored:
            raise DataError(f"{directory}: neither a saved DatasetDict (dataset_dict.json) nor directories of "
                            "saved splits (train/, validation/, test/ with state.json)")
    found = {}
    for split, aliases in SPLIT_ALIASES.items():
        name = next((alias for alias in aliases if alias in stored), None)
        if name is not None:
            value = stored[name]
            found[split] = datasets.load_from_disk(str(value)) if isinstance(value, Path) else value
    return found


def _split_records(directory: Path, splits: dict[str, Any], split: str) -> list[Record]:
    import datasets

    dataset = splits[split]
    label = f"{directory} split {split!r}"
    missing = [name for name in REQUIRED_COLUMNS if name not in dataset.column_names]
    if missing:
        raise DataError(f"{label}: missing column(s) {', '.join(map(repr, missing))}; "
                        f"columns: {', '.join(dataset.column_names)}")
    if isinstance(dataset.features["audio"], datasets.Audio):
        dataset = dataset.cast_column("audio", datasets.Audio(decode=False))
    _check_audio_paths(dataset, directory, label)
    text = dataset.select_columns([c for c in ("id", "prompt", "reference", "duration") if c in dataset.column_names])
    columns = text.to_dict()
    durations = columns.get("duration", [None] * len(dataset))
    records = []
    for index, (example_id, prompt, reference, duration) in enumerate(
            zip(columns["id"], columns["prompt"], columns["reference"], durations)):
        where = f"{label} row {index}"
        for key, value in (("id", example_id), ("prompt", prompt), ("reference", reference)):
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}: column {key!r} must be a non-empty string, found {value!r}")
        prompt = prompt.replace(SOUND, AUDIO)
        if AUDIO not in prompt:
            raise DataError(f"{where} (id {example_id}): the prompt has no {AUDIO} (or <sound>) placeholder: {prompt!r}")
        audio = PreparedAudio(dataset, index, directory, f"{where} (id {example_id})")
        records.append(Record(example_id, prompt, reference.strip(), audio, where,
                              None if duration is None else float(duration), question=prompt))
    return records


def _check_audio_paths(dataset: Any, directory: Path, label: str) -> None:
    """Rows whose audio has no embedded bytes must point at an existing file (checked from
    the Arrow validity bitmaps and the path strings, without reading any audio bytes)."""
    column = dataset.data.table.column("audio")
    if not (pa.types.is_struct(column.type) and {"bytes", "path"} <= {f.name for f in column.type}):
        return  # a stored waveform, not encoded audio
    offset = 0
    for chunk in column.chunks:
        has_bytes = chunk.field("bytes").is_valid().to_pylist()
        paths = chunk.field("path").to_pylist()
        for local, (present, path) in enumerate(zip(has_bytes, paths)):
            if not present and (path is None or _resolve(path, directory) is None):
                raise DataError(f"{label} row {offset + local}: column 'audio' has no bytes and its path "
                                f"{path!r} is not a file (absolute, or relative to {directory})")
        offset += len(chunk)


def _resolve(path: str, directory: Path) -> Path | None:
    candidate = Path(path)
    for option in (candidate, directory / candidate):
        if option.is_file():
            return option
    return None


@dataclass(frozen=True, eq=False)
class PreparedAudio:
    """The audio of one row of a saved dataset, read when needed: encoded bytes or a
    path (``Audio(decode=False)``), or a stored waveform (``{array, sampling_rate}`` or a
    plain list of 16 kHz samples)."""

    dataset: Any
    index: int
    directory: Path
    where: str

    def _source(self) -> AudioBytes | AudioFile | AudioArray:
        value = self.dataset[self.index]["audio"]
        if isinstance(value, dict) and value.get("bytes"):
            return AudioBytes(value["bytes"], self.where)
        if isinstance(value, dict) and value.get("path"):
            path = _resolve(value["path"], self.directory)
            if path is None:
                raise DataError(f"{self.where}: audio file {value['path']!r} not found")
            return AudioFile(path, self.where)
        if isinstance(value, dict) and value.get("array") is not None:
            return AudioArray(np.asarray(value["array"], dtype=np.float32), int(value["sampling_rate"]), self.where)
        if isinstance(value, (list, np.ndarray)) and len(value):
            return AudioArray(np.asarray(value, dtype=np.float32), SAMPLING_RATE, self.where)
        raise DataError(f"{self.where}: column 'audio' holds no audio ({type(value).__name__})")

    def read(self) -> np.ndarray:
        """[S] float32 at 16 kHz."""
        return self._source().read()

    def seconds(self) -> float:
        """Duration of the stored audio."""
        return self._source().seconds()
