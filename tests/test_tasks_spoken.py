"""The built-in spoken tasks: real espeak-ng speech, deterministic, cached."""

from __future__ import annotations

import random

import numpy as np
import pytest

from leaf_plugins import ConfigError, get_host
from leaf_plugins.tasks.synthetic_speech import resample, translation_items

SMALL = dict(train_size=6, eval_size=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    task = get_host().tasks.get("spoken-translation")
    return root, task, {split: task.load(split, cache_dir=str(root), **SMALL) for split in ("train", "validation", "test")}


def test_splits_sizes_audio_and_prompts(built):
    _, task, splits = built
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [6, 3, 3]
    ids = [e.id for s in splits.values() for e in s]
    assert len(set(ids)) == len(ids)
    for example in splits["train"]:
        assert example.audio.dtype == np.float32 and example.audio.ndim == 1
        assert 0.5 < example.duration < 6 and example.duration == pytest.approx(len(example.audio) / 16000)
        assert np.abs(example.audio).max() > 0.01  # speech, not silence
        assert "<|audio|>" in example.prompt and example.reference.endswith(".")
    assert task.reward == "sentence_bleu"


def test_building_is_deterministic_and_cached(built, tmp_path):
    root, task, splits = built
    again = task.load("train", cache_dir=str(tmp_path), **SMALL)  # built again from scratch elsewhere
    assert [(e.id, e.prompt, e.reference) for e in again] == [(e.id, e.prompt, e.reference) for e in splits["train"]]
    assert all(np.array_equal(a.audio, b.audio) for a, b in zip(again, splits["train"]))
    audio = next((root).glob("spoken-translation-*/audio/train-00000.wav"))
    stamp = audio.stat().st_mtime_ns
    task.load("train", cache_dir=str(root), **SMALL)
    assert audio.stat().st_mtime_ns == stamp  # read from the cache, not rebuilt
    other_seed = task.load("train", cache_dir=str(tmp_path), seed=1, **SMALL)
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


def test_unknown_split_is_named(built):
    _, task, _ = built
    with pytest.raises(ConfigError, match="no split 'dev'"):
        task.load("dev")


def test_resampling_keeps_a_tone_and_its_duration():
    rate_in, seconds, frequency = 22050, 0.5, 440.0
    t = np.arange(int(rate_in * seconds)) / rate_in
    tone = np.sin(2 * np.pi * frequency * t).astype(np.float32)
    out = resample(tone, rate_in, 16000)
    assert len(out) == 8000
    spectrum = np.abs(np.fft.rfft(out))
    assert np.fft.rfftfreq(len(out), 1 / 16000)[spectrum.argmax()] == pytest.approx(frequency, abs=2)
