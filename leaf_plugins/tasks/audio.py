"""Reading audio for the tasks: any file soundfile reads (WAV, FLAC, OGG, MP3), mixed to
mono and resampled to 16 kHz."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from leaf_plugins.tasks.errors import DataError
from leaf_plugins.tasks.resample import resample

__all__ = ["SAMPLING_RATE", "read_audio", "AudioFile", "AudioBytes", "AudioArray", "locate"]

SAMPLING_RATE = 16000


def read_audio(source: str | Path | bytes, where: str) -> np.ndarray:
    """The waveform in ``source`` (a path or encoded bytes) as [S] float32 at 16 kHz.
    ``where`` names the row it belongs to in the error raised when it cannot be read."""
    try:
        wave, rate = soundfile.read(io.BytesIO(source) if isinstance(source, bytes) else source,
                                    dtype="float32", always_2d=True)  # [S, channels]
    except (RuntimeError, OSError, TypeError) as error:
        name = "audio bytes" if isinstance(source, bytes) else str(source)
        raise DataError(f"{where}: cannot read {name}: {error}") from None
    return resample(wave.mean(axis=1), rate, SAMPLING_RATE)


@dataclass(frozen=True)
class AudioFile:
    """Audio in a file, read on demand."""

    path: Path
    where: str

    def read(self) -> np.ndarray:
        """[S] float32 at 16 kHz."""
        return read_audio(self.path, self.where)

    def seconds(self) -> float:
        """Duration from the file header."""
        try:
            info = soundfile.info(str(self.path))
        except (RuntimeError, OSError) as error:
            raise DataError(f"{self.where}: cannot read {self.path}: {error}") from None
        return info.frames / info.samplerate


@dataclass(frozen=True)
class AudioBytes:
    """Encoded audio (WAV/FLAC/MP3… bytes) held in memory or in an Arrow table."""

    data: bytes
    where: str

    def read(self) -> np.ndarray:
        """[S] float32 at 16 kHz."""
        return read_audio(self.data, self.where)

    def seconds(self) -> float:
        """Duration from the header."""
        info = soundfile.info(io.BytesIO(self.data))
        return info.frames / info.samplerate


@dataclass(frozen=True)
class AudioArray:
    """A decoded waveform and its sampling rate."""

    wave: np.ndarray  # [S]
    rate: int
    where: str

    def read(self) -> np.ndarray:
        """[S] float32 at 16 kHz."""
        return resample(np.asarray(self.wave, dtype=np.float32).reshape(-1), self.rate, SAMPLING_RATE)

    def seconds(self) -> float:
        """Duration of the waveform."""
        return len(self.wave) / self.rate


def locate(recorded: str, root: Path) -> Path | None:
    """The file ``recorded`` (a path written on the machine that built the metadata) under
    ``root``: ``root/recorded``, then ``root`` joined with ever shorter tails of it
    (``/data/LibriSpeech/train-clean-360/1/2/1-2-3.flac`` is found as
    ``root/train-clean-360/1/2/1-2-3.flac`` or ``root/1/2/1-2-3.flac``). ``None`` if absent."""
    path = Path(recorded)
    if path.is_absolute() and path.is_file():
        return path
    parts = [part for part in path.parts if part not in (path.anchor, "")]
    for start in range(len(parts)):
        candidate = root.joinpath(*parts[start:])
        if candidate.is_file():
            return candidate
    return None
