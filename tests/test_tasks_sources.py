"""The paper's tasks read from the public sources' own formats (LibriSQA JSON + LibriSpeech
FLAC, CoVoST2 TSV + Common Voice clips, LongAudio JSON + audio), with real audio files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from leaf_plugins import ConfigError
from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.prompts import COVOST2_TEMPLATES, LIBRISQA_TEMPLATES, LONGAUDIO_TEMPLATES
from tasks_fixtures import built, hashed, load, peak_frequency, write_audio


# ---------------------------------------------------------------- LibriSQA
def utterance(i: int) -> str:
    return f"{100 + i % 3}-{2000 + i % 2}-{i:04d}"


@pytest.fixture(scope="module")
def librisqa(tmp_path_factory):
    root = tmp_path_factory.mktemp("librisqa")
    speech, meta = root / "LibriSpeech", root / "LibriSQA-PartI"
    meta.mkdir()
    rows = {"train": [], "test": []}
    for split, subset, count in (("train", "train-clean-360", 40), ("test", "test-clean", 4)):
        for i in range(count):
            u = utterance(i)
            speaker, chapter, _ = u.split("-")
            write_audio(speech / subset / speaker / chapter / f"{u}.flac", 1.0 + i % 3, 16000)
            rows[split].append({"speech_path": f"/home/someone/LibriSpeech/{subset}/{speaker}/{chapter}/{u}.flac",
                                "question": f"What happens in passage {i}?", "answer": f" Answer {i}. ",
                                "text": "SOME TEXT", "duration": 1.0 + i % 3})
    (meta / "LibriSQA-PartI-train.json").write_text(json.dumps(rows["train"]))
    (meta / "LibriSQA-PartI-test.json").write_text(json.dumps(rows["test"]))
    return dict(librisqa_dir=str(meta), librispeech_dir=str(speech))


def test_librisqa_splits_templates_and_audio(librisqa):
    splits = {s: load("librisqa", s, **librisqa) for s in ("train", "validation", "test")}
    held_out = {utterance(i) for i in range(40) if hashed("split:" + utterance(i)) < 0.2}
    assert 0 < len(held_out) < 40
    assert {e.id for e in splits["validation"].records} == held_out
    assert {e.id for e in splits["train"].records} == {utterance(i) for i in range(40)} - held_out
    assert [r.id for r in splits["test"].records] == [utterance(i) for i in range(4)]
    example = splits["test"][1]
    assert example.reference == "Answer 1."
    expected = LIBRISQA_TEMPLATES[int(hashed(example.id) * 3)].replace("{question}", "What happens in passage 1?")
    assert example.prompt == expected
    assert example.audio.dtype == np.float32 and len(example.audio) == 32000 and example.duration == 2.0
    prompts = {r.prompt.split("What")[0] for r in splits["train"].records}
    assert len(prompts) == 3  # all three templates in use
    assert splits["test"].filtered == {}


def test_librisqa_validation_fraction_option(librisqa):
    none = load("librisqa", "validation", validation_fraction=0.0, **librisqa)
    assert len(none) == 0 and len(load("librisqa", "train", validation_fraction=0, **librisqa)) == 40


def test_librisqa_missing_flac_names_file_row_and_key(librisqa, tmp_path):
    meta = tmp_path / "meta"
    meta.mkdir()
    good = {"speech_path": "test-clean/100/2000/100-2000-0000.flac", "question": "Q?", "answer": "A"}
    missing = dict(good, speech_path="test-clean/9/9/9-9-9.flac")
    (meta / "LibriSQA-PartI-test.json").write_text(json.dumps([good, missing]))
    with pytest.raises(DataError, match=r"LibriSQA-PartI-test.json row 1 \(id 9-9-9\): key 'speech_path': "
                                        r"audio file 'test-clean/9/9/9-9-9.flac' not found"):
        load("librisqa", "test", librisqa_dir=str(meta), librispeech_dir=librisqa["librispeech_dir"])
    (meta / "LibriSQA-PartI-test.json").write_text(json.dumps([good, {"speech_path": "a.flac", "answer": "A"}]))
    with pytest.raises(DataError, match=r"row 1: missing key 'question'"):
        load("librisqa", "test", librisqa_dir=str(meta), librispeech_dir=librisqa["librispeech_dir"])
    (meta / "LibriSQA-PartI-test.json").write_text('[{"speech_path": "a.flac",\n "question": }]')
    with pytest.raises(DataError, match=r"LibriSQA-PartI-test.json:2:\d+: invalid JSON"):
        load("librisqa", "test", librisqa_dir=str(meta), librispeech_dir=librisqa["librispeech_dir"])


def test_options_are_checked():
    with pytest.raises(ConfigError, match="no data source given"):
        load("librisqa", "test")
    with pytest.raises(ConfigError, match="task 'librisqa' has no parameter 'librispeech'. Did you mean "
                                          "'librispeech_dir'"):
        load("librisqa", "test", librispeech="x", librisqa_dir="y")
    with pytest.raises(ConfigError, match="missing option.*librispeech_dir"):
        load("librisqa", "test", librisqa_dir="y")
    with pytest.raises(ConfigError, match="give one data source, not prepared and local files"):
        load("librisqa", "test", prepared="x", librisqa_dir="y", librispeech_dir="z")
    with pytest.raises(ConfigError, match="validation_fraction must be in"):
        load("librisqa", "test", validation_fraction=1.5, librisqa_dir="y", librispeech_dir="z")
    with pytest.raises(ConfigError, match=r"validation_fraction \+ test_fraction must be below 1"):
        load("dailytalk", "test", validation_fraction=0.5, test_fraction=0.5, json="x.json", audio_dir="z")
    with pytest.raises(ConfigError, match="librisqa_dir must be a string or null, got 3"):
        load("librisqa", "test", librisqa_dir=3, librispeech_dir="z")
    with pytest.raises(ConfigError, match="no split 'dev'"):
        load("covost2-en-de", "dev")


# ---------------------------------------------------------------- CoVoST2
RELEASE_HEADER = "path\tsentence\ttranslation\tclient_id\tsplit\n"


@pytest.fixture(scope="module")
def covost(tmp_path_factory):
    root = tmp_path_factory.mktemp("covost")
    clips = root / "cv" / "en" / "clips"
    lines = []
    for i, split in enumerate(["train", "train_covost", "dev", "test", "test", "train"]):
        name = f"common_voice_en_{i}.mp3" if i == 0 else f"common_voice_en_{i}.wav"
        write_audio(clips / name, 1.5, 48000 if i == 0 else 44100, frequency=300.0 + 100 * i, channels=2 if i == 1 else 1)
        lines.append(f"{name}\tHello number {i}.\tHallo Nummer {i}.\tclient{i}\t{split}\n")
    (root / "covost_v2.en_de.tsv").write_text(RELEASE_HEADER + "".join(lines))
    return root, clips


def test_covost_release_tsv_splits_and_resampling(covost):
    root, clips = covost
    options = dict(covost_dir=str(root), clips_dir=str(clips))
    train = load("covost2-en-de", "train", **options)
    assert [r.id for r in train.records] == ["common_voice_en_0", "common_voice_en_1", "common_voice_en_5"]
    assert [r.id for r in load("covost2-en-de", "validation", **options).records] == ["common_voice_en_2"]
    assert len(load("covost2-en-de", "test", **options)) == 2
    mp3, stereo = train[0], train[1]
    assert mp3.reference == "Hallo Nummer 0."
    assert mp3.prompt == COVOST2_TEMPLATES[int(hashed("common_voice_en_0") * 3)]
    assert abs(len(mp3.audio) - 24000) < 2000  # MP3 adds encoder padding
    assert peak_frequency(mp3.audio) == pytest.approx(300, abs=2)
    assert len(stereo.audio) == 24000 and peak_frequency(stereo.audio) == pytest.approx(400, abs=2)


def test_covost_per_split_tsvs_win(covost, tmp_path):
    _, clips = covost
    (tmp_path / "covost_v2.en_de.dev.tsv").write_text("path\tsentence\ttranslation\tclient_id\n"
                                                      "common_voice_en_3.wav\tHi.\tHallo.\tc\n")
    loaded = load("covost2-en-de", "validation", covost_dir=str(tmp_path), clips_dir=str(clips))
    assert [(r.id, r.reference) for r in loaded.records] == [("common_voice_en_3", "Hallo.")]


def test_covost_errors_name_line_and_column(covost, tmp_path):
    _, clips = covost
    options = dict(covost_dir=str(tmp_path), clips_dir=str(clips))
    (tmp_path / "covost_v2.en_de.tsv").write_text(RELEASE_HEADER + "common_voice_en_0.mp3\tHi.\tHallo.\tc\ttrain\n"
                                                  "common_voice_en_1.wav\tHi.\tHallo.\ttrain\n")
    with pytest.raises(DataError, match=r"covost_v2.en_de.tsv:3: expected 5 tab-separated fields .* found 4"):
        load("covost2-en-de", "train", **options)
    (tmp_path / "covost_v2.en_de.tsv").write_text("path\tsentence\tsplit\nx.mp3\tHi.\ttrain\n")
    with pytest.raises(DataError, match=r"covost_v2.en_de.tsv:1: missing column\(s\) 'translation'"):
        load("covost2-en-de", "train", **options)
    (tmp_path / "covost_v2.en_de.tsv").write_text(RELEASE_HEADER + "gone.mp3\tHi.\tHallo.\tc\ttrain\n")
    with pytest.raises(DataError, match=r"covost_v2.en_de.tsv:2: key 'path': audio file 'gone.mp3' not found"):
        load("covost2-en-de", "train", **options)


# ---------------------------------------------------------------- LongAudio / DailyTalk
def conversation(question: str, answer: str, sound_first: bool = True) -> list[dict]:
    human = f"<sound>\n{question}" if sound_first else f"{question}\n<sound>"
    return [{"from": "human", "value": human}, {"from": "gpt", "value": answer}]


@pytest.fixture(scope="module")
def dailytalk(tmp_path_factory):
    root = tmp_path_factory.mktemp("dailytalk")
    rows = []
    for i in range(30):
        write_audio(root / "audio" / f"d{i}" / f"{i}.wav", 0.5, 22050)
        turns = conversation(f"What is topic {i}?", f"Topic {i}.", sound_first=i % 2 == 0)
        if i % 10 == 1:  # multiple choice by its question
            turns = conversation(f"Choose the correct option: what is topic {i}? (A) x (B) y", "(A) x")
        if i % 10 == 2:  # multiple choice by its answer only
            turns = conversation(f"Which speaker is calmer in {i}?", "(B) the second")
        if i % 10 == 3:  # a follow-up pair without <sound>
            turns += [{"from": "human", "value": "And why?"}, {"from": "gpt", "value": "Because."}]
        rows.append({"id": f"dt_{i}", "sound": f"DailyTalk/audio/d{i}/{i}.wav",
                     "duration": 45.0 if i % 10 == 4 else 30.0, "conversations": turns})
    (root / "DailyTalk_LongAudio.json").write_text(json.dumps(rows))
    return dict(json=str(root / "DailyTalk_LongAudio.json"), audio_dir=str(root))


def split_of(key: str) -> str:
    value = hashed("split:" + key)
    return "test" if value < 0.1 else "validation" if value < 0.2 else "train"


def test_longaudio_filters_counts_splits_and_prompts(dailytalk):
    dailytalk_task = built("dailytalk", **dailytalk)
    loaded = {s: dailytalk_task.load(s) for s in ("train", "validation", "test")}
    expected_ids, expected_filtered = {s: set() for s in loaded}, {s: {} for s in loaded}
    for i in range(30):
        split = split_of(f"DailyTalk/audio/d{i}/{i}.wav")
        reason = {1: "multiple choice", 2: "multiple choice", 4: "longer than 40 s"}.get(i % 10)
        if reason:
            expected_filtered[split][reason] = expected_filtered[split].get(reason, 0) + 1
        else:
            expected_ids[split] |= {f"dt_{i}", f"dt_{i}-1"} if i % 10 == 3 else {f"dt_{i}"}
    for split, examples in loaded.items():
        assert {r.id for r in examples.records} == expected_ids[split]
        assert examples.filtered == expected_filtered[split]
    assert sum(e.filtered_total for e in loaded.values()) == 9
    assert dailytalk_task.last_filtered == expected_filtered["test"]
    records = {r.id: r for e in loaded.values() for r in e.records}
    assert records["dt_0"].prompt == "<|audio|>\nWhat is topic 0?"  # inherited layout
    assert records["dt_5"].prompt == "What is topic 5?\n<|audio|>"
    assert records["dt_3-1"].prompt == LONGAUDIO_TEMPLATES[int(hashed("dt_3-1") * 2)].replace("{question}", "And why?")
    assert records["dt_3-1"].reference == "Because."
    example = loaded["train"][0]
    assert len(example.audio) == 8000 and example.audio.dtype == np.float32


def test_longaudio_accepts_several_files_and_reports_bad_rows(dailytalk, tmp_path):
    second = tmp_path / "VoxPopuli_LongAudio.json"
    second.write_text("\n".join(json.dumps({"id": f"vp_{i}", "sound": f"audio/d{i}/{i}.wav",
                                            "conversations": conversation("Who speaks?", "A member.")})
                                for i in range(10)))  # JSON lines
    options = dict(json=f"{dailytalk['json']},{second}", audio_dir=dailytalk["audio_dir"])
    ids = {r.id for s in ("train", "validation", "test") for r in load("longaudio", s, **options).records}
    assert {f"vp_{i}" for i in range(10)} <= ids and "dt_0" in ids
    listed = dict(options, json=[dailytalk["json"], str(second)])  # a list, as YAML gives one
    assert ids == {r.id for s in ("train", "validation", "test") for r in load("longaudio", s, **listed).records}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "x", "sound": "audio/d0/0.wav",
                                "conversations": [{"from": "gpt", "value": "A"}, {"from": "human", "value": "Q"}]}]))
    with pytest.raises(DataError, match=r"bad.json row 0 \(id x\): key 'conversations'\[0\] should be a 'human' turn"):
        load("dailytalk", "train", json=str(bad), audio_dir=dailytalk["audio_dir"])
    bad.write_text(json.dumps([{"id": "y", "sound": "nowhere/0.wav", "conversations": conversation("Q?", "A")}]))
    with pytest.raises(DataError, match=r"bad.json row 0 \(id y\): key 'sound': audio file 'nowhere/0.wav' not found"):
        for split in ("train", "validation", "test"):
            load("dailytalk", split, json=str(bad), audio_dir=dailytalk["audio_dir"])


def test_unreadable_audio_names_the_row(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"not audio at all")
    (tmp_path / "d.json").write_text(json.dumps([{"id": "z", "sound": "a.wav", "conversations": conversation("Q?", "A")}]))
    loaded = [load("dailytalk", s, json=str(tmp_path / "d.json"), audio_dir=str(tmp_path), max_duration=None)
              for s in ("train", "validation", "test")]
    examples = next(e for e in loaded if len(e))
    with pytest.raises(DataError, match=r"d.json row 0: cannot read .*a.wav"):
        examples[0]


def test_show_command_prints_filtered_counts(dailytalk, capsys):
    from leaf_plugins.cli import main

    assert main(["tasks", "show", "dailytalk", f"json={dailytalk['json']}", f"audio_dir={dailytalk['audio_dir']}",
                 "--split", "train", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    expected = load("dailytalk", "train", **dailytalk)
    assert f"dailytalk/train: {len(expected)} examples from {dailytalk['json']}" in out
    assert f"filtered rows: {expected.filtered_total} (" in out and "multiple choice: " in out
    assert f"[{expected.records[0].id}] 0.50 s" in out
