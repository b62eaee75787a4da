"""LibriSQA Part I (Zhao et al.): JSON rows ``{speech_path, question, answer, text,
duration}`` beside a LibriSpeech directory of FLAC files. Part I has train and test files;
validation is a held-out fraction of train (by the stable hash of the utterance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from leaf_plugins.tasks.audio import AudioFile, locate
from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.examples import Record, UniqueIds
from leaf_plugins.tasks.prompts import qa_prompt
from leaf_plugins.tasks.rows import field, optional_number
from leaf_plugins.tasks.splits import held_out_split

__all__ = ["TRAIN_JSON", "TEST_JSON", "HUB_ID", "HUB_SPLITS", "librisqa_records", "source_file"]

TRAIN_JSON = "LibriSQA-PartI-train.json"
TEST_JSON = "LibriSQA-PartI-test.json"
HUB_ID = "ZihanZhao/LibriSQA"
HUB_SPLITS = {"train": "partI.train", "validation": "partI.train", "test": "partI.test"}


def source_file(split: str) -> str:
    """The Part I file holding ``split`` (validation is carved out of train)."""
    return TEST_JSON if split == "test" else TRAIN_JSON


def librisqa_records(rows: Iterable[tuple[str, Any]], librispeech_dir: Path, split: str,
                     validation_fraction: float) -> list[Record]:
    """Records of ``split`` from the rows of its Part I file (train file for train and
    validation). Ids are utterance ids (``1089-134686-0000``); a missing FLAC is an error."""
    ids, records = UniqueIds(), []
    for where, row in rows:
        speech_path = field(where, row, "speech_path")
        question, answer = field(where, row, "question"), field(where, row, "answer")
        utterance = Path(speech_path).stem
        example_id = ids(utterance)
        if split != "test" and held_out_split(utterance, validation_fraction) != split:
            continue
        path = locate(speech_path, librispeech_dir)
        if path is None:
            raise DataError(f"{where} (id {example_id}): key 'speech_path': audio file {speech_path!r} not found "
                            f"under {librispeech_dir} (tried the path and its shorter tails)")
        records.append(Record(example_id, qa_prompt(example_id, question), answer.strip(), AudioFile(path, where),
                              where, optional_number(where, row, "duration"), question))
    return records
