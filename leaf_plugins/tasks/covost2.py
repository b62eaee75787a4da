"""CoVoST2 English-to-German (Wang et al.): TSV metadata beside Common Voice English clips.

Either the release file ``covost_v2.en_de.tsv`` (columns ``path, translation, split`` and
usually ``sentence, client_id``; split ``train``/``train_covost`` -> train, ``dev`` ->
validation, ``test`` -> test) or the per-split files written by the authors'
``get_covost_splits.py`` (``covost_v2.en_de.{train,dev,test}.tsv``: ``path, sentence,
translation, client_id``). Hub rows (``client_id, file, audio, sentence, translation, id``)
go through the same parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from leaf_plugins.tasks.audio import AudioBytes, AudioFile, locate
from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.examples import Record, UniqueIds
from leaf_plugins.tasks.prompts import translation_prompt
from leaf_plugins.tasks.rows import field, tsv_rows

__all__ = ["RELEASE_TSV", "SPLIT_TSV", "SPLIT_VALUES", "covost_rows", "covost_records"]

RELEASE_TSV = "covost_v2.en_de.tsv"
SPLIT_TSV = {"train": "covost_v2.en_de.train.tsv", "validation": "covost_v2.en_de.dev.tsv",
             "test": "covost_v2.en_de.test.tsv"}
SPLIT_VALUES = {"train": ("train", "train_covost"), "validation": ("dev",), "test": ("test",)}


def covost_rows(covost_dir: Path, split: str) -> tuple[Iterable[tuple[str, dict[str, str]]], Path, bool]:
    """``(rows, file, needs_split_column)``: the per-split TSV when present, else the release TSV."""
    per_split = covost_dir / SPLIT_TSV[split]
    if per_split.is_file():
        return tsv_rows(per_split, ("path", "translation")), per_split, False
    release = covost_dir / RELEASE_TSV
    if release.is_file():
        return tsv_rows(release, ("path", "translation", "split")), release, True
    raise DataError(f"{covost_dir}: neither {SPLIT_TSV[split]} nor {RELEASE_TSV} is there")


def covost_records(rows: Iterable[tuple[str, Any]], clips_dir: Path | None, split: str,
                   by_split_column: bool) -> tuple[list[Record], int]:
    """Records of ``split`` and the number of rows whose ``split`` value is none of
    train, train_covost, dev, test. Ids are clip names (``common_voice_en_123``)."""
    ids, records, outside = UniqueIds(), [], 0
    known = {value for values in SPLIT_VALUES.values() for value in values}
    for where, row in rows:
        if by_split_column:
            value = field(where, row, "split")
            if value not in known:
                outside += 1
            if value not in SPLIT_VALUES[split]:
                continue
        clip = field(where, row, "path" if "path" in row else "file")
        translation = field(where, row, "translation")
        example_id = ids(str(row["id"]) if row.get("id") else Path(clip).stem)
        records.append(Record(example_id, translation_prompt(example_id), translation.strip(),
                              _audio(where, row, clip, clips_dir), where, question=row.get("sentence") or ""))
    return records, outside


def _audio(where: str, row: dict[str, Any], clip: str, clips_dir: Path | None) -> AudioBytes | AudioFile:
    embedded = row.get("audio")
    if isinstance(embedded, dict) and embedded.get("bytes"):
        return AudioBytes(embedded["bytes"], where)
    if clips_dir is None:
        raise DataError(f"{where}: the row has no embedded audio; give clips_dir (the Common Voice en/clips directory)")
    path = locate(clip, clips_dir)
    if path is None:
        raise DataError(f"{where}: key 'path': audio file {clip!r} not found in {clips_dir}")
    return AudioFile(path, where)
