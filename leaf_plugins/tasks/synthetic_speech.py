"""Built-in spoken tasks with real speech from espeak-ng, so that runs work offline.

``spoken-translation``: short English utterances with German references (CoVoST2-like).
``spoken-qa``: a short spoken passage and a text question with a short answer
(LibriSQA-like). Items come from templates and a small bilingual lexicon, drawn with a
seeded generator; each is spoken by one of several voices at one of several rates.
Audio is cached on disk after the first build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import torch

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.tasks.base import SPLITS, Example

__all__ = ["SpokenTask", "translation_items", "qa_items", "resample", "cache_root"]

SAMPLING_RATE = 16000
VOICES = ("en-us+m3", "en-us+f3", "en+m1", "en+f2")
RATES = (140, 160, 180)

SUBJECTS = [("the cat", "die Katze"), ("the dog", "der Hund"), ("my sister", "meine Schwester"),
            ("my brother", "mein Bruder"), ("the teacher", "der Lehrer"), ("the child", "das Kind")]
ADJECTIVES = [("big", "groß"), ("small", "klein"), ("happy", "glücklich"), ("tired", "müde"), ("old", "alt"),
              ("young", "jung")]
CITIES = [("Berlin", "Berlin"), ("Paris", "Paris"), ("London", "London"), ("Vienna", "Wien"),
          ("Munich", "München"), ("Rome", "Rom")]
NUMBERS = [("two", "zwei"), ("three", "drei"), ("four", "vier"), ("five", "fünf"), ("six", "sechs")]
THINGS = [("books", "Bücher"), ("apples", "Äpfel"), ("friends", "Freunde"), ("cars", "Autos")]
NAMES = ["Anna", "Peter", "Maria", "Thomas", "Laura", "David", "Sarah", "Martin"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white"]
JOBS = ["teacher", "doctor", "baker", "pilot", "farmer", "painter"]

TRANSLATION_PROMPTS = (
    "<|audio|> Listen to the speech and translate it into German.",
    "Translate the audio <|audio|> from English to German.",
    "You will hear English speech in <|audio|>. Provide the German translation.",
)
QA_PROMPTS = (
    "Listen to the audio <|audio|> and answer the following question: {question}",
    "<|audio|> Please answer this question about the spoken passage: {question}",
    "You will hear speech in <|audio|>. Answer: {question}",
)


@dataclass(frozen=True)
class Item:
    """One example before synthesis."""

    id: str
    speech: str  # what is spoken
    prompt: str
    reference: str


def translation_items(rng: random.Random, count: int, prefix: str) -> list[Item]:
    """English sentences with their German translations (correct by construction)."""
    items = []
    for index in range(count):
        (subject, subject_de) = rng.choice(SUBJECTS)
        pattern = rng.randrange(3)
        if pattern == 0:
            adjective, adjective_de = rng.choice(ADJECTIVES)
            english, german = f"{subject} is {adjective}", f"{subject_de} ist {adjective_de}"
        elif pattern == 1:
            city, city_de = rng.choice(CITIES)
            english, german = f"{subject} lives in {city}", f"{subject_de} wohnt in {city_de}"
        else:
            (number, number_de), (thing, thing_de) = rng.choice(NUMBERS), rng.choice(THINGS)
            english, german = f"{subject} has {number} {thing}", f"{subject_de} hat {number_de} {thing_de}"
        english, german = _sentence(english), _sentence(german)
        item_id = f"{prefix}-{index:05d}"
        prompt = TRANSLATION_PROMPTS[_stable_index(item_id, len(TRANSLATION_PROMPTS))]
        items.append(Item(item_id, english, prompt, german))
    return items


def qa_items(rng: random.Random, count: int, prefix: str) -> list[Item]:
    """Two-sentence passages with a question about one fact and its one-word answer."""
    items = []
    for index in range(count):
        name, (city, _), colour, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(COLOURS), rng.choice(JOBS)
        passage = f"{name} lives in {city} and works as a {job}. {name} drives a {colour} car."
        question, answer = rng.choice([
            (f"Where does {name} live?", city),
            (f"What is {name}'s job?", job),
            (f"What colour is {name}'s car?", colour),
        ])
        item_id = f"{prefix}-{index:05d}"
        prompt = QA_PROMPTS[_stable_index(item_id, len(QA_PROMPTS))].format(question=question)
        items.append(Item(item_id, passage, prompt, answer))
    return items


class SpokenTask:
    """A built-in spoken task (``spoken-translation`` or ``spoken-qa``).

    Options of ``load``: ``seed`` (0), ``train_size`` (240), ``eval_size`` (40, for each
    of validation and test), ``cache_dir`` (default ``$LEAF_CACHE_DIR/tasks`` or
    ``~/.cache/leaf-plugins/tasks``).
    """

    reward = "sentence_bleu"

    def __init__(self, name: str, make_items: Any) -> None:
        self.name = name
        self.make_items = make_items
        self.__doc__ = f"Built-in {name} task with espeak-ng speech (offline; built once, cached)."

    def load(self, split: str, seed: int = 0, train_size: int = 240, eval_size: int = 40,
             cache_dir: str | None = None) -> list[Example]:
        """The examples of ``split``, building and caching the whole task if needed."""
        if split not in SPLITS:
            raise ConfigError(f"task {self.name!r} has no split {split!r}; splits: {', '.join(SPLITS)}")
        root = Path(cache_dir) if cache_dir else cache_root()
        directory = root / f"{self.name}-seed{seed}-train{train_size}-eval{eval_size}"
        if not (directory / "examples.jsonl").exists():
            self._build(directory, seed, {"train": train_size, "validation": eval_size, "test": eval_size})
        rows = [json.loads(line) for line in (directory / "examples.jsonl").read_text().splitlines()]
        return [
            Example(row["id"], _read_wav(directory / row["audio"]), row["prompt"], row["reference"], row["duration"])
            for row in rows
            if row["split"] == split
        ]

    def _build(self, directory: Path, seed: int, sizes: dict[str, int]) -> None:
        rng = random.Random(f"{self.name}:{seed}")
        planned = [(split, item) for split, size in sizes.items() for item in self.make_items(rng, size, split)]
        voices = [(rng.choice(VOICES), rng.choice(RATES)) for _ in planned]
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "audio").mkdir(parents=True)
        from tqdm import tqdm

        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2) * 2) as pool:
            waves = list(tqdm(pool.map(lambda job: synthesise(job[1].speech, *job[0]), zip(voices, (i for _, i in planned))),
                              total=len(planned), desc=f"building {self.name}", unit="clip"))
        with (partial / "examples.jsonl").open("w") as handle:
            for (split, item), (voice, rate), wave in zip(planned, voices, waves):
                name = f"audio/{item.id}.wav"
                soundfile.write(partial / name, wave, SAMPLING_RATE, subtype="PCM_16")
                handle.write(json.dumps({
                    "id": item.id, "split": split, "audio": name, "prompt": item.prompt, "reference": item.reference,
                    "speech": item.speech, "voice": voice, "rate": rate, "duration": len(wave) / SAMPLING_RATE,
                }) + "\n")
        partial.rename(directory)


def synthesise(text: str, voice: str, rate: int) -> np.ndarray:
    """``text`` spoken by espeak-ng, as a float32 waveform at 16 kHz."""
    if shutil.which("espeak-ng") is None:
        raise ConfigError("the built-in spoken tasks need espeak-ng: install it with 'apt-get install -y espeak-ng' "
                          "(scripts/install.sh does this when run as root)")
    done = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text], capture_output=True, check=True)
    wave, rate_in = soundfile.read(io.BytesIO(done.stdout), dtype="float32")
    return resample(wave, rate_in, SAMPLING_RATE)


def resample(wave: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Band-limited resampling (linear interpolation after a low-pass at the new
    Nyquist frequency when downsampling)."""
    if rate_in == rate_out:
        return wave.astype(np.float32)
    signal = torch.from_numpy(np.asarray(wave, dtype=np.float32))
    if rate_out < rate_in:  # windowed-sinc low-pass
        cutoff = rate_out / rate_in / 2
        taps = torch.arange(-32, 33, dtype=torch.float32)
        kernel = 2 * cutoff * torch.sinc(2 * cutoff * taps) * torch.hann_window(65, periodic=False)
        signal = torch.nn.functional.conv1d(signal.view(1, 1, -1), (kernel / kernel.sum()).view(1, 1, -1),
                                            padding=32).view(-1)
    length = int(round(len(signal) * rate_out / rate_in))
    resized = torch.nn.functional.interpolate(signal.view(1, 1, -1), size=length, mode="linear", align_corners=False)
    return resized.view(-1).numpy()


def cache_root() -> Path:
    """Where built tasks are cached."""
    base = os.environ.get("LEAF_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "leaf-plugins") / "tasks"


def _read_wav(path: Path) -> np.ndarray:
    wave, rate = soundfile.read(path, dtype="float32")
    if rate != SAMPLING_RATE:
        raise ConfigError(f"{path}: expected {SAMPLING_RATE} Hz audio, found {rate} Hz")
    return wave


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _stable_index(key: str, count: int) -> int:
    """A template index from the example id (a stable hash, unlike ``hash()``)."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % count


@hookimpl
def register_tasks(register) -> None:  # type: ignore[no-untyped-def]
    register("spoken-translation", SpokenTask("spoken-translation", translation_items))
    register("spoken-qa", SpokenTask("spoken-qa", qa_items))
