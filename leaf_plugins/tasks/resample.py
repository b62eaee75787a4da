"""Band-limited resampling in pure torch (polyphase windowed sinc; no torchaudio/librosa)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

__all__ = ["resample", "sinc_kernel"]

ZERO_CROSSINGS = 16  # sinc lobes kept on each side of a tap
ROLLOFF = 0.95  # cutoff as a fraction of the lower Nyquist frequency


@lru_cache(maxsize=16)
def sinc_kernel(rate_in: int, rate_out: int) -> tuple[torch.Tensor, int, int, int]:
    """Filters of the polyphase resampler: ``(kernel [new, 1, orig + 2 * width], orig, new, width)``
    where ``orig / new`` is ``rate_in / rate_out`` in lowest terms. Output sample ``q * new + j``
    sits at input time ``q * orig + j * orig / new``; filter ``j`` holds the windowed sinc
    ``c * sinc(c * (t - k)) * hann`` at the input samples ``k`` around it, ``c`` the cutoff."""
    common = math.gcd(rate_in, rate_out)
    orig, new = rate_in // common, rate_out // common
    cutoff = min(1.0, new / orig) * ROLLOFF  # in cycles per input sample, times two
    half_width = ZERO_CROSSINGS / cutoff  # in input samples
    width = math.ceil(half_width)
    offsets = torch.arange(-width, orig + width, dtype=torch.float64)  # [K]
    phases = torch.arange(new, dtype=torch.float64)[:, None] * orig / new  # [new, 1]
    distance = phases - offsets  # [new, K]
    window = torch.where(distance.abs() <= half_width, torch.cos(math.pi * distance / (2 * half_width)) ** 2, 0.0)
    kernel = cutoff * torch.sinc(cutoff * distance) * window  # [new, K]
    return kernel.to(torch.float32)[:, None, :], orig, new, width


def resample(wave: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """``wave`` ([S] float) from ``rate_in`` to ``rate_out`` Hz: [ceil(S * rate_out / rate_in)] float32.
    Frequencies above 95% of the lower Nyquist frequency are removed before decimating."""
    signal = np.asarray(wave, dtype=np.float32)
    if rate_in == rate_out:
        return signal
    if rate_in <= 0 or rate_out <= 0:
        raise ValueError(f"sampling rates must be positive, got {rate_in} -> {rate_out}")
    kernel, orig, new, width = sinc_kernel(rate_in, rate_out)
    length = math.ceil(len(signal) * new / orig)
    padded = torch.nn.functional.pad(torch.from_numpy(signal), (width, width + orig))  # [S + 2 * width + orig]
    frames = padded.unfold(0, kernel.shape[-1], orig)  # [Q, K] strided view: input around output block q
    phases = frames @ kernel[:, 0, :].t()  # [Q, new]: output q * new + j
    return phases.reshape(-1)[:length].contiguous().numpy()  # [length]
