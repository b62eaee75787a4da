"""Small real-format fixtures for the task tests: audio files written with soundfile, and
registered tasks built with their parameters as a run builds them."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from leaf_plugins import get_host
from leaf_plugins.core.parameters import configured


def tone(seconds: float, rate: int, frequency: float = 440.0) -> np.ndarray:
    """[S] float32 sine."""
    t = np.arange(int(round(seconds * rate))) / rate
    return (0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def write_audio(path: Path, seconds: float, rate: int, frequency: float = 440.0, channels: int = 1) -> Path:
    """A real audio file (format from the suffix: .wav, .flac, .mp3)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    wave = tone(seconds, rate, frequency)
    soundfile.write(path, np.stack([wave] * channels, axis=1) if channels > 1 else wave, rate)
    return path


def encoded(seconds: float, rate: int, fmt: str = "WAV") -> bytes:
    """Encoded audio bytes."""
    buffer = io.BytesIO()
    soundfile.write(buffer, tone(seconds, rate), rate, format=fmt)
    return buffer.getvalue()


def hashed(key: str) -> float:
    """The stable hash written out again (SHA-256, first 8 bytes, big-endian, over 2**64)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) / 2**64


def peak_frequency(wave: np.ndarray, rate: int = 16000) -> float:
    spectrum = np.abs(np.fft.rfft(wave))
    return float(np.fft.rfftfreq(len(wave), 1 / rate)[spectrum.argmax()])


def built(name: str, **options: Any) -> Any:
    """Registered task ``name`` built with ``options`` (its parameters), as a run builds it."""
    return configured("task", name, get_host().tasks.get(name), options)


def load(name: str, split: str, **options: Any) -> Any:
    """The examples of ``split`` of task ``name`` built with ``options``."""
    return built(name, **options).load(split)
