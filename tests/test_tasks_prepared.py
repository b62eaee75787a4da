"""The authors' prepared format: real save_to_disk directories (a DatasetDict, or one
directory per split), and the hub code path on a local dataset folder."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from leaf_plugins.tasks.errors import DataError
from tasks_fixtures import encoded, hashed, load, peak_frequency, write_audio


def rows(prefix: str, count: int, rate: int, durations: list[float] | None = None) -> dict:
    durations = durations or [1.0] * count
    return {
        "task": ["longaudio"] * count,
        "id": [f"{prefix}{i}" for i in range(count)],
        "prompt": [f"<sound>\nQuestion {i}?" for i in range(count)],
        "reference": [f"Answer {i}." for i in range(count)],
        "audio": [{"bytes": encoded(d, rate, "FLAC"), "path": None} for d in durations],
        "duration": durations,
    }


def test_dataset_dict_with_filters_and_resampling(tmp_path):
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(rows("t", 5, 22050, [1.0, 41.0, 1.0, 1.0, 1.0])),
        "validation": datasets.Dataset.from_dict(rows("v", 2, 16000)),
        "test": datasets.Dataset.from_dict(rows("s", 2, 16000)),
    }).cast_column("audio", datasets.Audio())
    splits.save_to_disk(str(tmp_path / "prepared"))
    train = load("longaudio", "train", prepared=str(tmp_path / "prepared"))
    assert [r.id for r in train.records] == ["t0", "t2", "t3", "t4"] and train.filtered == {"longer than 40 s": 1}
    example = train[0]
    assert example.prompt == "<|audio|>\nQuestion 0?" and example.reference == "Answer 0."
    assert len(example.audio) == 16000 and peak_frequency(example.audio) == pytest.approx(440, abs=2)
    assert [r.id for r in load("longaudio", "validation", prepared=str(tmp_path / "prepared")).records] == ["v0", "v1"]


def test_directory_per_split_without_validation(tmp_path):
    root = tmp_path / "prepared"
    data = rows("c", 30, 16000)
    data["prompt"] = ["Translate the audio <|audio|> from English to German."] * 30
    datasets.Dataset.from_dict(data).cast_column("audio", datasets.Audio()).save_to_disk(str(root / "train"))
    datasets.Dataset.from_dict(rows("s", 2, 16000)).save_to_disk(str(root / "test"))  # audio stored as a plain struct
    held = {f"c{i}" for i in range(30) if hashed(f"split:c{i}") < 0.2}
    train = load("covost2-en-de", "train", prepared=str(root), validation_fraction=0.2)
    validation = load("covost2-en-de", "validation", prepared=str(root), validation_fraction=0.2)
    assert {r.id for r in validation.records} == held and {r.id for r in train.records} == {f"c{i}" for i in range(30)} - held
    assert "held-out 0.2 of train" in validation.source
    test = load("covost2-en-de", "test", prepared=str(root))
    assert test[1].audio.dtype == np.float32 and len(test[1].audio) == 16000


def test_prepared_errors_name_row_and_column(tmp_path):
    root = tmp_path / "prepared"
    data = rows("r", 3, 16000)
    data["prompt"][2] = "no placeholder here"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(data)}).save_to_disk(str(root))
    with pytest.raises(DataError, match=r"split 'train' row 2 \(id r2\): the prompt has no <\|audio\|>"):
        load("librisqa", "train", prepared=str(root))
    with pytest.raises(DataError, match=r"no 'test' split .* found: train"):
        load("librisqa", "test", prepared=str(root))
    paths = {"id": ["p0", "p1"], "prompt": ["<|audio|> Q"] * 2, "reference": ["A"] * 2,
             "audio": [{"bytes": encoded(0.1, 16000), "path": None}, {"bytes": None, "path": str(tmp_path / "gone.wav")}]}
    features = datasets.Features({"id": datasets.Value("string"), "prompt": datasets.Value("string"),
                                  "reference": datasets.Value("string"),
                                  "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}})
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(paths, features=features)}).save_to_disk(str(tmp_path / "paths"))
    with pytest.raises(DataError, match=r"split 'train' row 1: column 'audio' has no bytes and its path '.*gone.wav'"):
        load("librisqa", "train", prepared=str(tmp_path / "paths"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"id": ["x"], "prompt": ["<|audio|>"]})}).save_to_disk(
        str(tmp_path / "columns"))
    with pytest.raises(DataError, match=r"missing column\(s\) 'reference', 'audio'"):
        load("librisqa", "train", prepared=str(tmp_path / "columns"))
    with pytest.raises(DataError, match="no such directory"):
        load("librisqa", "train", prepared=str(tmp_path / "absent"))


def test_hub_code_path_on_a_local_dataset_folder(tmp_path):
    """datasets.load_dataset on a folder laid out like ZihanZhao/LibriSQA (same split names)."""
    repo = tmp_path / "LibriSQA"
    (repo / "LibriSQA-PartI").mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: partI.train\n    path: LibriSQA-PartI/LibriSQA-PartI-train.json\n"
        "  - split: partI.test\n    path: LibriSQA-PartI/LibriSQA-PartI-test.json\n---\n")
    for split in ("train", "test"):
        (repo / "LibriSQA-PartI" / f"LibriSQA-PartI-{split}.json").write_text(json.dumps(
            [{"speech_path": f"{split}/1-2-{i}.flac", "question": "Q?", "answer": f"A{i}", "text": "T", "duration": 1.0}
             for i in range(3)]))
        for i in range(3):
            write_audio(tmp_path / "speech" / split / f"1-2-{i}.flac", 0.25, 16000)
    test = load("librisqa", "test", hub=str(repo), librispeech_dir=str(tmp_path / "speech"))
    assert [(r.id, r.reference) for r in test.records] == [("1-2-0", "A0"), ("1-2-1", "A1"), ("1-2-2", "A2")]
    assert len(test[0].audio) == 4000


@pytest.mark.parametrize("name", ["librisqa", "covost2-en-de", "dailytalk", "longaudio"])
def test_every_paper_task_loads_the_prepared_format_in_all_splits(name, tmp_path):
    data = rows("x", 3, 16000)
    data["task"] = [name] * 3
    splits = {split: datasets.Dataset.from_dict(data) for split in ("train", "validation", "test")}
    datasets.DatasetDict(splits).cast_column("audio", datasets.Audio()).save_to_disk(str(tmp_path / name))
    for split in ("train", "validation", "test"):
        loaded = load(name, split, prepared=str(tmp_path / name))
        assert [r.id for r in loaded.records] == ["x0", "x1", "x2"]
        assert loaded[2].prompt == "<|audio|>\nQuestion 2?" and loaded[2].reference == "Answer 2."
        assert len(loaded[2].audio) == 16000 and loaded[2].duration == pytest.approx(1.0)
