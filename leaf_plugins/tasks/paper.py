"""The paper's four speech tasks: ``librisqa``, ``covost2-en-de``, ``dailytalk``, ``longaudio``.

Each reads one of three sources, chosen by the options given to ``load``: the authors'
prepared ``save_to_disk`` directory (``prepared=DIR``), the public source's own files
(paths), or the Hugging Face hub (``hub=ID``, needs network). The paper's filters apply
to every source; ``ExampleList.filtered`` (and ``task.last_filtered``) count what they removed.
See docs/tasks.md for layouts and options.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.tasks import covost2, librisqa, longaudio
from leaf_plugins.tasks.examples import ExampleList, Record, apply_filters
from leaf_plugins.tasks.filters import LONG_FORM_MAX_SECONDS
from leaf_plugins.tasks.hub import hub_rows
from leaf_plugins.tasks.options import Option, parse_options
from leaf_plugins.tasks.rows import json_rows
from leaf_plugins.tasks.splits import check_fractions, check_split

__all__ = ["PaperTask", "LibriSQATask", "CoVoST2Task", "LongAudioTask"]

PREPARED = Option("prepared", "path", None, "the authors' save_to_disk directory (DatasetDict or one directory per split)")
HUB = Option("hub", "str", None, "Hugging Face hub id of the source metadata (network needed)")


class PaperTask(ABC):
    """Common loading: options, source choice, the paper's filters, filtered counts."""

    name = ""
    options: tuple[Option, ...] = ()
    local_options: tuple[str, ...] = ()  # options whose presence selects the public source's files
    required_local: tuple[str, ...] = ()  # options that source needs
    sources_help = ""
    drop_multiple_choice = False

    def __init__(self) -> None:
        self.last_filtered: dict[str, int] = {}

    def load(self, split: str, **options: Any) -> ExampleList:
        """The examples of ``split``, lazily read (audio on access), after the filters."""
        check_split(self.name, split)
        values = parse_options(self.name, self.options, options)
        check_fractions(self.name, **{k: v for k, v in values.items() if k.endswith("_fraction")})
        records, source, removed = self._records(split, values)
        kept, filtered = apply_filters(records, values.get("max_duration"), self.drop_multiple_choice,
                                       f"{self.name}/{split}")
        filtered.update(removed)
        self.last_filtered = filtered
        return ExampleList(kept, filtered, source)

    def _records(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        chosen = [name for name in ("prepared", "hub") if values[name] is not None]
        local = [name for name in self.local_options if values[name] is not None]
        if local:
            chosen.append("local files")
        if len(chosen) != 1:
            problem = "no data source given" if not chosen else f"give one data source, not {' and '.join(chosen)}"
            raise ConfigError(f"task {self.name!r}: {problem}. {self.sources_help}")
        if values["prepared"] is not None:
            from leaf_plugins.tasks.prepared import prepared_records  # pyarrow: imported when a prepared set is read

            records, source = prepared_records(values["prepared"], split, values["validation_fraction"])
            return records, source, {}
        if values["hub"] is not None:
            return self._hub(split, values)
        missing = [name for name in self.required_local if values[name] is None]
        if missing:
            raise ConfigError(f"task {self.name!r}: missing option(s) {', '.join(missing)}. {self.sources_help}")
        return self._local(split, values)

    @abstractmethod
    def _local(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        """Records, source description and extra filtered counts from the public source's files."""

    @abstractmethod
    def _hub(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        """Records, source description and extra filtered counts from the hub."""


def _needed(task: str, option: str, value: Path | None, why: str) -> Path:
    if value is None:
        raise ConfigError(f"task {task!r}: option {option} is needed {why}")
    return value


class LibriSQATask(PaperTask):
    """LibriSQA Part I spoken QA (open-ended answers over LibriSpeech)."""

    name = "librisqa"
    options = (
        PREPARED, HUB,
        Option("librisqa_dir", "path", None, f"directory with {librisqa.TRAIN_JSON} and {librisqa.TEST_JSON}"),
        Option("librispeech_dir", "path", None, "LibriSpeech directory (FLAC): train-clean-360/, test-clean/"),
        Option("validation_fraction", "float", 0.2, "held-out share of train used as validation"),
        Option("max_duration", "float", None, "drop clips longer than this (seconds)"),
    )
    local_options = ("librisqa_dir",)
    required_local = ("librisqa_dir", "librispeech_dir")
    sources_help = (f"Give prepared=DIR, or librisqa_dir=DIR librispeech_dir=DIR, or hub={librisqa.HUB_ID} "
                    "librispeech_dir=DIR")

    def _local(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        path = values["librisqa_dir"] / librisqa.source_file(split)
        records = librisqa.librisqa_records(json_rows(path), values["librispeech_dir"], split, values["validation_fraction"])
        return records, str(path), {}

    def _hub(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        audio = _needed(self.name, "librispeech_dir", values["librispeech_dir"], "with hub (the audio is not on the hub)")
        rows = hub_rows(values["hub"], librisqa.HUB_SPLITS[split])
        source = f"{values['hub']} {librisqa.HUB_SPLITS[split]}"
        return librisqa.librisqa_records(rows, audio, split, values["validation_fraction"]), source, {}


class CoVoST2Task(PaperTask):
    """CoVoST2 English-to-German speech translation (Common Voice English clips)."""

    name = "covost2-en-de"
    options = (
        PREPARED, HUB,
        Option("hub_config", "str", "en_de", "config of the hub dataset"),
        Option("covost_dir", "path", None, f"directory with {covost2.RELEASE_TSV} or the per-split TSVs"),
        Option("clips_dir", "path", None, "Common Voice English clips directory (cv-corpus-*/en/clips)"),
        Option("validation_fraction", "float", 0.05, "held-out share of train, for a prepared directory without validation"),
        Option("max_duration", "float", None, "drop clips longer than this (seconds)"),
    )
    local_options = ("covost_dir",)
    required_local = ("covost_dir", "clips_dir")
    sources_help = "Give prepared=DIR, or covost_dir=DIR clips_dir=DIR, or hub=ID (a parquet export of facebook/covost2)"

    def _local(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        rows, path, by_column = covost2.covost_rows(values["covost_dir"], split)
        records, outside = covost2.covost_records(rows, values["clips_dir"], split, by_column)
        return records, str(path), {"split value not train/train_covost/dev/test": outside} if outside else {}

    def _hub(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        rows = hub_rows(values["hub"], split, values["hub_config"])
        records, _ = covost2.covost_records(rows, values["clips_dir"], split, by_split_column=False)
        return records, f"{values['hub']} {split}", {}


class LongAudioTask(PaperTask):
    """LongAudio-derived long-form spoken QA (clips of at most 40 s, no multiple choice)."""

    drop_multiple_choice = True
    local_options = ("json",)
    required_local = ("json", "audio_dir")

    def __init__(self, name: str, description: str, hub_splits: str, example_json: str) -> None:
        super().__init__()
        self.name = name
        self.__doc__ = description
        self.options = (
            PREPARED, HUB,
            Option("hub_split", "str", hub_splits, f"split(s) of {longaudio.HUB_ID}, comma-separated"),
            Option("json", "paths", None, f"LongAudio JSON file(s), comma-separated (e.g. {example_json})"),
            Option("audio_dir", "path", None, "directory the 'sound' paths are relative to"),
            Option("validation_fraction", "float", 0.1, "held-out share of clips used as validation"),
            Option("test_fraction", "float", 0.1, "held-out share of clips used as test"),
            Option("max_duration", "float", LONG_FORM_MAX_SECONDS, "drop clips longer than this (seconds)"),
        )
        self.sources_help = (f"Give prepared=DIR, or json={example_json} audio_dir=DIR, or hub={longaudio.HUB_ID} "
                             "audio_dir=DIR")

    def _local(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        rows = (row for path in values["json"] for row in json_rows(path))
        records = longaudio.longaudio_records(rows, values["audio_dir"], split, values["validation_fraction"],
                                              values["test_fraction"])
        return records, ", ".join(map(str, values["json"])), {}

    def _hub(self, split: str, values: dict[str, Any]) -> tuple[list[Record], str, dict[str, int]]:
        audio = _needed(self.name, "audio_dir", values["audio_dir"], "with hub (the audio is not on the hub)")
        names = [name.strip() for name in values["hub_split"].split(",") if name.strip()]
        rows = (row for name in names for row in hub_rows(values["hub"], name))
        records = longaudio.longaudio_records(rows, audio, split, values["validation_fraction"], values["test_fraction"])
        return records, f"{values['hub']} {','.join(names)}", {}


@hookimpl
def register_tasks(register) -> None:  # type: ignore[no-untyped-def]
    register("librisqa", LibriSQATask())
    register("covost2-en-de", CoVoST2Task())
    register("dailytalk", LongAudioTask("dailytalk", "DailyTalk long-form spoken QA from LongAudio (<= 40 s, no multiple choice).",
                                        "daily_talk", "DailyTalk_LongAudio.json"))
    register("longaudio", LongAudioTask("longaudio", "Europarl/VoxPopuli long-form spoken QA from LongAudio (<= 40 s, no multiple choice).",
                                        "europarl,voxpoupuli", "Europarl_LongAudio.json,VoxPopuli_LongAudio.json"))
