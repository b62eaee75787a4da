"""The built-in spoken tasks: real espeak-ng speech, deterministic, cached; ``leaf tasks``."""

from __future__ import annotations

import hashlib
import random
import re

import numpy as np
import pytest

from leaf_plugins import ConfigError
from leaf_plugins.cli import main
from leaf_plugins.tasks.synthetic_speech import cache_root, qa_items, translation_items
from tasks_fixtures import built as built_task, load

SMALL = dict(size=12, validation_size=3, test_size=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    task = built_task("spoken-translation", cache_dir=str(root), **SMALL)
    return root, task, {split: task.load(split) for split in ("train", "validation", "test")}


def test_splits_sizes_audio_and_prompts(built):
    root, task, splits = built
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [6, 3, 3]
    assert (root / "spoken-translation-0-12-v3-t3" / "examples.jsonl").is_file()
    ids = [e.id for s in splits.values() for e in s]
    assert len(set(ids)) == len(ids)
    for example in splits["train"]:
        assert example.audio.dtype == np.float32 and example.audio.ndim == 1
        assert 0.5 < example.duration < 6 and example.duration == pytest.approx(len(example.audio) / 16000)
        assert np.abs(example.audio).max() > 0.01  # speech, not silence
        assert "<|audio|>" in example.prompt and example.reference.endswith(".")


def test_building_is_deterministic_and_cached(built, tmp_path):
    root, task, splits = built
    again = load("spoken-translation", "train", cache_dir=str(tmp_path), **SMALL)  # built again from scratch elsewhere
    assert [(e.id, e.prompt, e.reference) for e in again] == [(e.id, e.prompt, e.reference) for e in splits["train"]]

    def digest(examples):
        return hashlib.sha256(b"".join(e.audio.tobytes() for e in examples)).hexdigest()

    assert digest(again) == digest(splits["train"])
    audio = next(root.glob("spoken-translation-*/audio/train-00000.wav"))
    stamp = audio.stat().st_mtime_ns
    task.load("train")
    assert audio.stat().st_mtime_ns == stamp  # read from the cache, not rebuilt
    other_seed = load("spoken-translation", "train", cache_dir=str(tmp_path), seed=1, **SMALL)
    assert [e.reference for e in other_seed] != [e.reference for e in splits["train"]]


def test_german_references_by_hand():
    """Every generated sentence translated again with a hand-written phrase table."""
    phrases = {
        "the cat": "die Katze", "the dog": "der Hund", "my sister": "meine Schwester", "my brother": "mein Bruder",
        "the teacher": "der Lehrer", "the child": "das Kind", "is": "ist", "lives in": "wohnt in", "has": "hat",
        "big": "groß", "small": "klein", "happy": "glücklich", "tired": "müde", "old": "alt", "young": "jung",
        "Berlin": "Berlin", "Paris": "Paris", "London": "London", "Vienna": "Wien", "Munich": "München", "Rome": "Rom",
        "two": "zwei", "three": "drei", "four": "vier", "five": "fünf", "six": "sechs",
        "books": "Bücher", "apples": "Äpfel", "friends": "Freunde", "cars": "Autos",
    }
    items = translation_items(random.Random(3), 60, "x")
    patterns = set()
    for item in items:
        text = item.speech[0].lower() + item.speech[1:-1]
        words, german = text.split(), []
        while words:  # longest phrase first
            for size in (2, 1):
                phrase = " ".join(words[:size])
                if phrase in phrases:
                    german.append(phrases[phrase])
                    words = words[size:]
                    break
            else:
                raise AssertionError(f"untranslatable: {item.speech}")
        expected = " ".join(german)
        assert item.reference == expected[0].upper() + expected[1:] + "."
        patterns.add(german[1])
    assert patterns == {"ist", "wohnt in", "hat"}  # all three sentence patterns were drawn


def test_qa_answers_by_hand():
    """The answer is read back from the passage with a regex, per question type."""
    pattern = r"(\w+) lives in (\w+) and works as a (\w+)\. \1 has (\w+) (\w+) and drives a (\w+) car\."
    kinds = set()
    for item in qa_items(random.Random(5), 80, "x"):
        name, city, job, number, pets, colour = re.fullmatch(pattern, item.speech).groups()
        expected = {f"Where does {name} live?": city, f"What is {name}'s job?": job,
                    f"How many {pets} does {name} have?": number, f"What colour is {name}'s car?": colour}
        asked = [question for question in expected if item.prompt.endswith(question)]
        assert len(asked) == 1 and expected[asked[0]] == item.reference
        assert item.prompt.count("<|audio|>") == 1
        kinds.add(asked[0].split()[1])
    assert kinds == {"does", "is", "many", "colour"}


def test_unknown_split_is_named(built):
    _, task, _ = built
    with pytest.raises(ConfigError, match="no split 'dev'"):
        task.load("dev")


def test_sizes_are_checked_and_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"validation_size \(8\) \+ test_size \(8\) must not exceed size \(10\)"):
        load("spoken-qa", "train", size=10, validation_size=8, test_size=8, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="test_size must not be negative, got -1"):
        load("spoken-qa", "train", test_size=-1, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="size must be an integer, got 'ten'"):
        load("spoken-qa", "train", size="ten", cache_dir=str(tmp_path))
    monkeypatch.setenv("LEAF_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache" / "tasks"


def test_missing_espeak_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no espeak-ng on this PATH
    with pytest.raises(ConfigError, match=re.escape("run 'apt-get install -y espeak-ng'")):
        load("spoken-qa", "train", size=4, cache_dir=str(tmp_path))


def test_command_builds_and_shows(tmp_path, capsys):
    argv = ["tasks", "build", "spoken-qa", "--size", "8", "--seed", "3", "--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    assert "spoken-qa: 8 examples (train 6, validation 1, test 1) built in" in capsys.readouterr().out
    assert main(argv) == 0
    assert "found in the cache" in capsys.readouterr().out
    assert main(["tasks", "show", "spoken-qa", "size=8", "seed=3", f"cache_dir={tmp_path}", "--split", "train",
                 "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "spoken-qa/train: 6 examples" in out and "filtered rows: 0" in out and out.count("prompt:") == 2
    assert main(["tasks", "show", "librisqa", "librispeech=/x"]) == 2
    assert "Did you mean 'librispeech_dir'" in capsys.readouterr().err
    assert main(["tasks", "show", "spoken-qa", "size=eight"]) == 2
    assert "size must be an integer, got 'eight'" in capsys.readouterr().err
    assert main(["tasks", "show", "spoken-qa", "size"]) == 2
    assert "task parameters are key=value pairs, got 'size'" in capsys.readouterr().err
