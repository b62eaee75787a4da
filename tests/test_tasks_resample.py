"""The polyphase sinc resampler against a direct sum, and on tones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from leaf_plugins.tasks.resample import resample


def direct(x: np.ndarray, rate_in: int, rate_out: int, m: int) -> float:
    """Output sample m by the textbook sum: windowed sinc at input time m * rate_in / rate_out."""
    c = min(1.0, rate_out / rate_in) * 0.95
    half = 16 / c
    d = m * rate_in / rate_out - np.arange(len(x))
    window = np.where(np.abs(d) <= half, np.cos(np.pi * d / (2 * half)) ** 2, 0.0)
    return float((x * c * np.sinc(c * d) * window).sum())


@pytest.mark.parametrize("rate_in,rate_out", [(22050, 16000), (48000, 16000), (44100, 16000), (8000, 16000)])
def test_matches_the_direct_sum(rate_in, rate_out):
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    y = resample(x, rate_in, rate_out)
    assert len(y) == math.ceil(3000 * rate_out / rate_in) and y.dtype == np.float32
    for m in (0, 1, 5, len(y) // 3, len(y) - 1):
        assert y[m] == pytest.approx(direct(x, rate_in, rate_out, m), abs=1e-5)


@pytest.mark.parametrize("rate_in", [22050, 44100, 48000])
def test_keeps_a_tone_and_removes_aliases(rate_in):
    t = np.arange(rate_in // 2) / rate_in
    low = np.sin(2 * np.pi * 440 * t)
    high = np.sin(2 * np.pi * 9000 * t)  # above the new Nyquist frequency: must vanish, not alias
    out = resample((low + high).astype(np.float32), rate_in, 16000)
    assert len(out) == 8000
    expected = np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
    assert np.abs(out[200:-200] - expected[200:-200]).max() < 5e-3  # the alias would have amplitude 1


def test_same_rate_is_identity():
    x = np.arange(10, dtype=np.float64)
    assert np.array_equal(resample(x, 16000, 16000), x.astype(np.float32))
