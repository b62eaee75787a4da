"""LongAudio question answering (Ghosh et al.; ``nvidia/LongAudio``): JSON rows ``{id, sound,
duration, conversations: [{from: human, value: "<sound>\\nQ"}, {from: gpt, value: A}, ...]}``
beside the audio directory; used for the DailyTalk and Europarl/VoxPopuli (``longaudio``)
sets. The files have no splits: train/validation/test are held-out fractions by the stable
hash of the clip (``sound``), so that all questions about a clip share a split."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from leaf_plugins.tasks.audio import AudioFile, locate
from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.examples import Record, UniqueIds
from leaf_plugins.tasks.prompts import longaudio_prompt
from leaf_plugins.tasks.rows import field, optional_number
from leaf_plugins.tasks.splits import held_out_split

__all__ = ["HUB_ID", "longaudio_records"]

HUB_ID = "nvidia/LongAudio"


def longaudio_records(rows: Iterable[tuple[str, Any]], audio_dir: Path, split: str, validation_fraction: float,
                      test_fraction: float) -> list[Record]:
    """Records of ``split``: one per (human, gpt) turn pair. The id is the row id, with
    ``-k`` for the k-th pair (k >= 1) of a multi-turn row."""
    ids, records = UniqueIds(), []
    for where, row in rows:
        row_id, sound = field(where, row, "id"), field(where, row, "sound")
        pairs = _pairs(f"{where} (id {row_id})", row)
        if held_out_split(sound, validation_fraction, test_fraction) != split:
            continue
        path = locate(sound, audio_dir)
        if path is None:
            raise DataError(f"{where} (id {row_id}): key 'sound': audio file {sound!r} not found under {audio_dir}")
        duration = optional_number(where, row, "duration")
        for k, (human, answer) in enumerate(pairs):
            example_id = ids(row_id if k == 0 else f"{row_id}-{k}")
            prompt, question = longaudio_prompt(example_id, human)
            records.append(Record(example_id, prompt, answer.strip(), AudioFile(path, where), where, duration, question))
    return records


def _pairs(where: str, row: dict[str, Any]) -> list[tuple[str, str]]:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: key 'conversations' must be a non-empty list of turns, found {turns!r}")
    if len(turns) % 2:
        raise DataError(f"{where}: key 'conversations' has {len(turns)} turns; expected human/gpt pairs")
    pairs = []
    for index in range(0, len(turns), 2):
        values = []
        for offset, speaker in enumerate(("human", "gpt")):
            turn = turns[index + offset]
            if not isinstance(turn, dict) or turn.get("from") != speaker:
                raise DataError(f"{where}: key 'conversations'[{index + offset}] should be a {speaker!r} turn, "
                                f"found {turn!r}")
            values.append(field(f"{where} conversations[{index + offset}]", turn, "value"))
        pairs.append((values[0], values[1]))
    return pairs
