"""The paper's four speech tasks: ``librisqa``, ``covost2-en-de``, ``dailytalk``, ``longaudio``.

Each reads one of three sources, chosen by the parameters it is built with
(``task.options``): the authors' prepared ``save_to_disk`` directory (``prepared=DIR``),
the public source's own files (paths), or the Hugging Face hub (``hub=ID``, needs
network). The paper's filters apply to every source; ``ExampleList.filtered`` (and the
loading task's ``last_filtered``) count what they removed. See docs/tasks.md for layouts
and parameters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.parameters import parameterised
from leaf_plugins.tasks import covost2, librisqa, longaudio
from leaf_plugins.tasks.examples import ExampleList, Record, apply_filters
from leaf_plugins.tasks.filters import LONG_FORM_MAX_SECONDS
from leaf_plugins.tasks.hub import hub_rows
from leaf_plugins.tasks.rows import json_rows
from leaf_plugins.tasks.splits import check_fraction, check_fractions, check_split

__all__ = ["PaperParams", "LibriSQAParams", "CoVoST2Params", "LongAudioParams", "DailyTalkParams", "PaperTask",
           "LibriSQATask", "CoVoST2Task", "LongAudioTask", "DailyTalkTask"]

MAX_DURATION_HELP = "drop clips longer than this (seconds)"


@dataclass(frozen=True)
class PaperParams:
    """The parameters every paper task takes: the prepared and the hub source. Each
    ``*_fraction`` parameter of a task must be in [0, 1)."""

    prepared: str | None = field(default=None, metadata={
        "help": "the authors' save_to_disk directory (DatasetDict or one directory per split)"})
    hub: str | None = field(default=None, metadata={
        "help": "Hugging Face hub id of the source metadata (network needed)"})

    def __post_init__(self) -> None:
        for item in fields(self):
            if item.name.endswith("_fraction"):
                check_fraction(item.name, getattr(self, item.name))


@dataclass(frozen=True)
class LibriSQAParams(PaperParams):
    """The parameters of ``librisqa``."""

    librisqa_dir: str | None = field(default=None, metadata={
        "help": f"directory with {librisqa.TRAIN_JSON} and {librisqa.TEST_JSON}"})
    librispeech_dir: str | None = field(default=None, metadata={
        "help": "LibriSpeech directory (FLAC): train-clean-360/, test-clean/"})
    validation_fraction: float = field(default=0.2, metadata={"help": "held-out share of train used as validation"})
    max_duration: float | None = field(default=None, metadata={"help": MAX_DURATION_HELP})


@dataclass(frozen=True)
class CoVoST2Params(PaperParams):
    """The parameters of ``covost2-en-de``."""

    hub_config: str = field(default="en_de", metadata={"help": "config of the hub dataset"})
    covost_dir: str | None = field(default=None, metadata={
        "help": f"directory with {covost2.RELEASE_TSV} or the per-split TSVs"})
    clips_dir: str | None = field(default=None, metadata={
        "help": "Common Voice English clips directory (cv-corpus-*/en/clips)"})
    validation_fraction: float = field(default=0.05, metadata={
        "help": "held-out share of train, for a prepared directory without validation"})
    max_duration: float | None = field(default=None, metadata={"help": MAX_DURATION_HELP})


@dataclass(frozen=True)
class LongAudioParams(PaperParams):
    """The parameters of ``longaudio`` (Europarl and VoxPopuli)."""

    hub_split: str = field(default="europarl,voxpoupuli", metadata={
        "help": f"split(s) of {longaudio.HUB_ID}, comma-separated"})
    json: str | list[str] | None = field(default=None, metadata={
        "help": "LongAudio JSON file(s), comma-separated or a list (e.g. "
                "Europarl_LongAudio.json,VoxPopuli_LongAudio.json)"})
    audio_dir: str | None = field(default=None, metadata={"help": "directory the 'sound' paths are relative to"})
    validation_fraction: float = field(default=0.1, metadata={"help": "held-out share of clips used as validation"})
    test_fraction: float = field(default=0.1, metadata={"help": "held-out share of clips used as test"})
    max_duration: float | None = field(default=LONG_FORM_MAX_SECONDS, metadata={"help": MAX_DURATION_HELP})


@dataclass(frozen=True)
class DailyTalkParams(LongAudioParams):
    """The parameters of ``dailytalk``: those of ``longaudio`` with DailyTalk's hub split."""

    hub_split: str = field(default="daily_talk", metadata={
        "help": f"split(s) of {longaudio.HUB_ID}, comma-separated"})
    json: str | list[str] | None = field(default=None, metadata={
        "help": "LongAudio JSON file(s), comma-separated or a list (e.g. DailyTalk_LongAudio.json)"})


class PaperTask(ABC):
    """Common loading: source choice, the paper's filters, filtered counts. A task is
    built with its parameters (``Task(params)``, which ``configured`` does) and loads
    from the source they select."""

    name = ""
    local_options: tuple[str, ...] = ()  # parameters whose presence selects the public source's files
    required_local: tuple[str, ...] = ()  # parameters that source needs
    sources_help = ""
    drop_multiple_choice = False

    def __init__(self, params: LibriSQAParams | CoVoST2Params | LongAudioParams) -> None:
        self.params = params
        self.last_filtered: dict[str, int] = {}

    def load(self, split: str) -> ExampleList:
        """The examples of ``split``, lazily read (audio on access), after the filters."""
        check_split(self.name, split)
        check_fractions(self.name, **{item.name: getattr(self.params, item.name) for item in fields(self.params)
                                      if item.name.endswith("_fraction")})
        records, source, removed = self._records(split)
        kept, filtered = apply_filters(records, self.params.max_duration, self.drop_multiple_choice,
                                       f"{self.name}/{split}")
        filtered.update(removed)
        self.last_filtered = filtered
        return ExampleList(kept, filtered, source)

    def _records(self, split: str) -> tuple[list[Record], str, dict[str, int]]:
        chosen = [name for name in ("prepared", "hub") if getattr(self.params, name) is not None]
        if any(getattr(self.params, name) is not None for name in self.local_options):
            chosen.append("local files")
        if len(chosen) != 1:
            problem = "no data source given" if not chosen else f"give one data source, not {' and '.join(chosen)}"
            raise ConfigError(f"task {self.name!r}: {problem}. {self.sources_help}")
        if self.params.prepared is not None:
            from leaf_plugins.tasks.prepared import prepared_records  # pyarrow: imported when a prepared set is read

            records, source = prepared_records(_path(self.params.prepared), split, self.params.validation_fraction)
            return records, source, {}
        if self.params.hub is not None:
            return self._hub(split, self.params.hub)
        missing = [name for name in self.required_local if getattr(self.params, name) is None]
        if missing:
            raise ConfigError(f"task {self.name!r}: missing option(s) {', '.join(missing)}. {self.sources_help}")
        return self._local(split)

    @abstractmethod
    def _local(self, split: str) -> tuple[list[Record], str, dict[str, int]]:
        """Records, source description and extra filtered counts from the public source's files."""

    @abstractmethod
    def _hub(self, split: str, hub: str) -> tuple[list[Record], str, dict[str, int]]:
        """Records, source description and extra filtered counts from hub dataset ``hub``."""

    def _needed(self, option: str, why: str) -> Path:
        """The path parameter ``option``, which the source chosen needs (``why``)."""
        value = getattr(self.params, option)
        if value is None:
            raise ConfigError(f"task {self.name!r}: option {option} is needed {why}")
        return _path(value)


def _path(value: str) -> Path:
    """A path parameter as a ``Path``, ``~`` expanded."""
    return Path(value).expanduser()


def _paths(value: str | list[str]) -> list[Path]:
    """A paths parameter (comma-separated or a list) as ``Path``s, empty items left out."""
    items = value.split(",") if isinstance(value, str) else value
    return [_path(item.strip()) for item in items if item.strip()]


@parameterised(LibriSQAParams)
class LibriSQATask(PaperTask):
    """LibriSQA Part I spoken QA (open-ended answers over LibriSpeech)."""

    name = "librisqa"
    params: LibriSQAParams
    local_options = ("librisqa_dir",)
    required_local = ("librisqa_dir", "librispeech_dir")
    sources_help = (f"Give prepared=DIR, or librisqa_dir=DIR librispeech_dir=DIR, or hub={librisqa.HUB_ID} "
                    "librispeech_dir=DIR")

    def _local(self, split: str) -> tuple[list[Record], str, dict[str, int]]:
        path = self._needed("librisqa_dir", "for the local files") / librisqa.source_file(split)
        records = librisqa.librisqa_records(json_rows(path), self._needed("librispeech_dir", "for the local files"),
                                            split, self.params.validation_fraction)
        return records, str(path), {}

    def _hub(self, split: str, hub: str) -> tuple[list[Record], str, dict[str, int]]:
        audio = self._needed("librispeech_dir", "with hub (the audio is not on the hub)")
        rows = hub_rows(hub, librisqa.HUB_SPLITS[split])
        source = f"{hub} {librisqa.HUB_SPLITS[split]}"
        return librisqa.librisqa_records(rows, audio, split, self.params.validation_fraction), source, {}


@parameterised(CoVoST2Params)
class CoVoST2Task(PaperTask):
    """CoVoST2 English-to-German speech translation (Common Voice English clips)."""

    name = "covost2-en-de"
    params: CoVoST2Params
    local_options = ("covost_dir",)
    required_local = ("covost_dir", "clips_dir")
    sources_help = "Give prepared=DIR, or covost_dir=DIR clips_dir=DIR, or hub=ID (a parquet export of facebook/covost2)"

    def _local(self, split: str) -> tuple[list[Record], str, dict[str, int]]:
        rows, path, by_column = covost2.covost_rows(self._needed("covost_dir", "for the local files"), split)
        records, outside = covost2.covost_records(rows, self._needed("clips_dir", "for the local files"), split,
                                                  by_column)
        return records, str(path), {"split value not train/train_covost/dev/test": outside} if outside else {}

    def _hub(self, split: str, hub: str) -> tuple[list[Record], str, dict[str, int]]:
        rows = hub_rows(hub, split, self.params.hub_config)
        clips = None if self.params.clips_dir is None else _path(self.params.clips_dir)  # audio may be embedded
        records, _ = covost2.covost_records(rows, clips, split, by_split_column=False)
        return records, f"{hub} {split}", {}


@parameterised(LongAudioParams)
class LongAudioTask(PaperTask):
    """Europarl/VoxPopuli long-form spoken QA from LongAudio (<= 40 s, no multiple choice)."""

    name = "longaudio"
    params: LongAudioParams
    drop_multiple_choice = True
    local_options = ("json",)
    required_local = ("json", "audio_dir")
    sources_help = (f"Give prepared=DIR, or json=Europarl_LongAudio.json,VoxPopuli_LongAudio.json audio_dir=DIR, "
                    f"or hub={longaudio.HUB_ID} audio_dir=DIR")

    def _local(self, split: str) -> tuple[list[Record], str, dict[str, int]]:
        paths = _paths(self.params.json or [])
        rows = (row for path in paths for row in json_rows(path))
        records = longaudio.longaudio_records(rows, self._needed("audio_dir", "for the local files"), split,
                                              self.params.validation_fraction, self.params.test_fraction)
        return records, ", ".join(map(str, paths)), {}

    def _hub(self, split: str, hub: str) -> tuple[list[Record], str, dict[str, int]]:
        audio = self._needed("audio_dir", "with hub (the audio is not on the hub)")
        names = [name.strip() for name in self.params.hub_split.split(",") if name.strip()]
        rows = (row for name in names for row in hub_rows(hub, name))
        records = longaudio.longaudio_records(rows, audio, split, self.params.validation_fraction,
                                              self.params.test_fraction)
        return records, f"{hub} {','.join(names)}", {}


@parameterised(DailyTalkParams)
class DailyTalkTask(LongAudioTask):
    """DailyTalk long-form spoken QA from LongAudio (<= 40 s, no multiple choice)."""

    name = "dailytalk"
    params: DailyTalkParams
    sources_help = (f"Give prepared=DIR, or json=DailyTalk_LongAudio.json audio_dir=DIR, or hub={longaudio.HUB_ID} "
                    "audio_dir=DIR")


@hookimpl
def register_tasks(register) -> None:  # type: ignore[no-untyped-def]
    register("librisqa", LibriSQATask(LibriSQAParams()))
    register("covost2-en-de", CoVoST2Task(CoVoST2Params()))
    register("dailytalk", DailyTalkTask(DailyTalkParams()))
    register("longaudio", LongAudioTask(LongAudioParams()))
