"""Built-in spoken tasks with real speech from espeak-ng, so that runs work offline.

``spoken-translation``: short English utterances with German references (CoVoST2-like).
``spoken-qa``: a short spoken passage and a text question with a short answer
(LibriSQA-like). Items come from templates and a small bilingual lexicon, drawn with a
seeded generator; each is spoken by one of several voices at one of several rates, and
resampled from espeak's 22.05 kHz to 16 kHz. A build is cached on disk
(``<cache>/<name>-<seed>-<size>``) and reused.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.interrupts import interrupt_point
from leaf_plugins.tasks.audio import SAMPLING_RATE, AudioFile
from leaf_plugins.tasks.examples import ExampleList, Record
from leaf_plugins.tasks.prompts import qa_prompt, translation_prompt
from leaf_plugins.tasks.resample import resample
from leaf_plugins.tasks.splits import check_split

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SpokenParams", "SpokenTask", "Build", "translation_items", "qa_items", "synthesise", "cache_root",
           "ESPEAK_INSTALL"]

VOICES = ("en-us+m3", "en-us+f3", "en+m1", "en+f2")
RATES = (140, 160, 180)
ESPEAK_INSTALL = "apt-get install -y espeak-ng"
MANIFEST = "examples.jsonl"

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
PETS = ["cats", "dogs", "birds", "rabbits"]


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
        item_id = f"{prefix}-{index:05d}"
        items.append(Item(item_id, _sentence(english), translation_prompt(item_id), _sentence(german)))
    return items


def qa_items(rng: random.Random, count: int, prefix: str) -> list[Item]:
    """Two-sentence passages (a name, a city, a job, a number of pets, a car colour) with a
    question about one fact and its one-word answer."""
    items = []
    for index in range(count):
        name, (city, _), job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
        (number, _), pets, colour = rng.choice(NUMBERS), rng.choice(PETS), rng.choice(COLOURS)
        passage = (f"{name} lives in {city} and works as a {job}. "
                   f"{name} has {number} {pets} and drives a {colour} car.")
        question, answer = rng.choice([
            (f"Where does {name} live?", city),
            (f"What is {name}'s job?", job),
            (f"How many {pets} does {name} have?", number),
            (f"What colour is {name}'s car?", colour),
        ])
        item_id = f"{prefix}-{index:05d}"
        items.append(Item(item_id, passage, qa_prompt(item_id, question), answer))
    return items


@dataclass(frozen=True)
class Build:
    """A built task on disk."""

    directory: Path
    sizes: dict[str, int]
    built: bool  # False when the cache was reused
    seconds: float


@dataclass(frozen=True)
class SpokenParams:
    """The parameters of a built-in spoken task (``task.options``)."""

    seed: int = field(default=0, metadata={"help": "seed of the items, voices and rates"})
    size: int = field(default=320, metadata={"help": "examples in all splits"})
    validation_size: int | None = field(default=None, metadata={"help": "validation examples (default size // 8)"})
    test_size: int | None = field(default=None, metadata={"help": "test examples (default size // 8)"})
    cache_dir: str | None = field(default=None, metadata={
        "help": "where builds are cached (default $LEAF_CACHE_DIR/tasks or ~/.cache/leaf-plugins/tasks)"})
    workers: int | None = field(default=None, metadata={"help": "parallel espeak-ng processes (default 2 x CPUs)"})

    def __post_init__(self) -> None:
        for name in ("size", "validation_size", "test_size"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")


class SpokenTask:
    """A built-in spoken task (``spoken-translation`` or ``spoken-qa``) with its
    parameters (``SpokenParams``); ``with_parameters`` gives the same task with others."""

    parameters = SpokenParams

    def __init__(self, name: str, make_items: Callable[[random.Random, int, str], list[Item]],
                 params: SpokenParams = SpokenParams()) -> None:
        self.name = name
        self.make_items = make_items
        self.params = params
        self.last_filtered: dict[str, int] = {}
        self.__doc__ = f"Built-in {name} task with espeak-ng speech (offline; built once, cached)."

    def with_parameters(self, params: SpokenParams) -> SpokenTask:
        """This task (its name and items) built with ``params``."""
        return SpokenTask(self.name, self.make_items, params)

    def load(self, split: str) -> ExampleList:
        """The examples of ``split``, building and caching the whole task if needed."""
        check_split(self.name, split)
        build = self.build()
        records = []
        for line in (build.directory / MANIFEST).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["split"] == split:
                where = f"{build.directory / MANIFEST} id {row['id']}"
                records.append(Record(row["id"], row["prompt"], row["reference"],
                                      AudioFile(build.directory / row["audio"], where), where, row["duration"]))
        return ExampleList(records, {}, str(build.directory))

    def build(self) -> Build:
        """Build the task into the cache (or find it there); see ``SpokenParams``."""
        params = self.params
        sizes = self._sizes()
        root = cache_root() if params.cache_dir is None else Path(params.cache_dir).expanduser()
        suffix = "" if params.validation_size is None and params.test_size is None else \
            f"-v{sizes['validation']}-t{sizes['test']}"
        directory = root / f"{self.name}-{params.seed}-{params.size}{suffix}"
        if (directory / MANIFEST).is_file():
            return Build(directory, sizes, False, 0.0)
        start = time.perf_counter()
        self._build(directory, params.seed, sizes, params.workers or 2 * (os.cpu_count() or 1))
        return Build(directory, sizes, True, time.perf_counter() - start)

    def _sizes(self) -> dict[str, int]:
        """Examples per split: validation and test (``size // 8`` each unless given), train the rest."""
        size = self.params.size
        validation = size // 8 if self.params.validation_size is None else self.params.validation_size
        test = size // 8 if self.params.test_size is None else self.params.test_size
        if validation + test > size:
            raise ConfigError(f"task {self.name!r}: validation_size ({validation}) + test_size ({test}) must not "
                              f"exceed size ({size})")
        return {"train": size - validation - test, "validation": validation, "test": test}

    def _build(self, directory: Path, seed: int, sizes: dict[str, int], workers: int) -> None:
        import soundfile
        from tqdm import tqdm

        require_espeak()
        rng = random.Random(f"{self.name}:{seed}")
        planned = [(split, item) for split, size in sizes.items() for item in self.make_items(rng, size, split)]
        voices = [(rng.choice(VOICES), rng.choice(RATES)) for _ in planned]
        partial = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "audio").mkdir(parents=True)
        jobs = [(item.speech, voice, rate) for (_, item), (voice, rate) in zip(planned, voices)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            waves = []
            for wave in tqdm(pool.map(lambda job: synthesise(*job), jobs), total=len(jobs),
                             desc=f"building {self.name}", unit="clip"):
                interrupt_point()  # Ctrl-C stops between clips (the partial directory is removed at the next build)
                waves.append(wave)
        with (partial / MANIFEST).open("w", encoding="utf-8") as handle:
            for (split, item), (voice, rate), wave in zip(planned, voices, waves):
                name = f"audio/{item.id}.wav"
                soundfile.write(partial / name, wave, SAMPLING_RATE, subtype="FLOAT")
                handle.write(json.dumps({
                    "id": item.id, "split": split, "audio": name, "prompt": item.prompt, "reference": item.reference,
                    "speech": item.speech, "voice": voice, "rate": rate, "duration": len(wave) / SAMPLING_RATE,
                }, ensure_ascii=False) + "\n")
        try:
            partial.rename(directory)
        except OSError:  # another process finished the same build first
            shutil.rmtree(partial, ignore_errors=True)
            if not (directory / MANIFEST).is_file():
                raise


def require_espeak() -> None:
    """Raise a ``ConfigError`` saying how to install espeak-ng when it is missing."""
    if shutil.which("espeak-ng") is None:
        raise ConfigError(f"the built-in spoken tasks need espeak-ng, which is not installed: run "
                          f"'{ESPEAK_INSTALL}' (as root, or with sudo; scripts/install.sh does it)")


def synthesise(text: str, voice: str, rate: int) -> np.ndarray:
    """``text`` spoken by espeak-ng (voice, words per minute): [S] float32 at 16 kHz."""
    import soundfile

    require_espeak()
    done = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text], capture_output=True)
    if done.returncode != 0:
        raise ConfigError(f"espeak-ng failed for voice {voice!r}: {done.stderr.decode(errors='replace').strip()}")
    wave, rate_in = soundfile.read(io.BytesIO(done.stdout), dtype="float32")  # [S] at 22.05 kHz
    return resample(wave, rate_in, SAMPLING_RATE)


def cache_root() -> Path:
    """Where built tasks are cached: ``$LEAF_CACHE_DIR/tasks``, else ``~/.cache/leaf-plugins/tasks``."""
    base = os.environ.get("LEAF_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "leaf-plugins") / "tasks"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


@hookimpl
def register_tasks(register) -> None:  # type: ignore[no-untyped-def]
    register("spoken-translation", SpokenTask("spoken-translation", translation_items))
    register("spoken-qa", SpokenTask("spoken-qa", qa_items))
