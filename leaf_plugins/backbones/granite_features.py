"""Granite Speech's audio front end in plain torch (no torchaudio): HTK mel filters, the
log-mel spectrogram and the feature extractor built on them. Imported when a Granite
processor is built, not when the backbones are registered."""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import BatchFeature
from transformers.models.granite_speech.feature_extraction_granite_speech import GraniteSpeechFeatureExtractor

__all__ = ["TorchGraniteSpeechFeatureExtractor", "htk_mel_filters", "log_mel"]


def htk_mel_filters(n_freqs: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """``[n_freqs, n_mels]`` triangular HTK-scale filters from 0 Hz to Nyquist, unnormalised
    (torchaudio's ``melscale_fbanks`` with ``mel_scale="htk"``, ``norm=None``)."""
    frequencies = torch.linspace(0, sample_rate // 2, n_freqs)
    top = 2595.0 * math.log10(1.0 + (sample_rate / 2) / 700.0)
    mel_points = torch.linspace(0.0, top, n_mels + 2)
    hz_points = 700.0 * (10 ** (mel_points / 2595.0) - 1.0)
    gaps = hz_points[1:] - hz_points[:-1]  # [n_mels + 1]
    slopes = hz_points.unsqueeze(0) - frequencies.unsqueeze(1)  # [n_freqs, n_mels + 2]
    falling = -slopes[:, :-2] / gaps[:-1]
    rising = slopes[:, 2:] / gaps[1:]
    return torch.clamp(torch.minimum(falling, rising), min=0.0)


def log_mel(audio: torch.Tensor, n_fft: int, win_length: int, hop_length: int, filters: torch.Tensor) -> torch.Tensor:
    """``[B, frames, n_mels]`` power-2 mel spectrogram of ``[B, S]`` audio (centred frames,
    reflect padding, periodic Hann window), then Granite's log10 scaling: clipped at 1e-10,
    floored 8 below each clip's maximum, divided by 4, plus 1."""
    window = torch.hann_window(win_length, device=audio.device)
    spectrum = torch.stft(audio.float(), n_fft, hop_length, win_length, window, center=True, pad_mode="reflect",
                          normalized=False, onesided=True, return_complex=True)  # [B, F, frames]
    mel = torch.matmul(spectrum.abs().pow(2).transpose(1, 2), filters.to(audio.device))  # [B, frames, n_mels]
    logmel = mel.clamp(min=1e-10).log10()
    top = logmel.amax(dim=(-2, -1), keepdim=True)
    return torch.maximum(logmel, top - 8.0) / 4 + 1


class TorchGraniteSpeechFeatureExtractor(GraniteSpeechFeatureExtractor):
    """Granite's feature extractor with its mel spectrogram computed in plain torch, so
    it works where torchaudio cannot be installed. Same parameters, same outputs."""

    def __init__(self, sampling_rate: int = 16000, n_fft: int = 512, win_length: int = 400, hop_length: int = 160,
                 n_mels: int = 80, projector_window_size: int = 15, projector_downsample_rate: int = 5,
                 padding_value: float = 0.0, **kwargs: Any) -> None:
        feature_size = n_mels if kwargs.get("feature_size") is None else kwargs.pop("feature_size")
        # Granite's own __init__ builds torchaudio's mel filters: skip it and initialise its
        # base, which is SequenceFeatureExtractor from transformers 5.11 and the plain
        # FeatureExtractionMixin (keyword arguments become attributes) before
        super(GraniteSpeechFeatureExtractor, self).__init__(feature_size=feature_size, sampling_rate=sampling_rate,
                                                            padding_value=padding_value, **kwargs)
        self.sampling_rate = sampling_rate
        self.melspec_kwargs = {"sample_rate": sampling_rate, "n_fft": n_fft, "win_length": win_length,
                               "hop_length": hop_length, "n_mels": n_mels}
        self.mel_filters = htk_mel_filters(n_fft // 2 + 1, n_mels, sampling_rate)  # [F, n_mels]; not serialised
        self.projector_window_size = projector_window_size
        self.projector_downsample_rate = projector_downsample_rate

    def __call__(self, audios: Any, device: str | None = "cpu") -> BatchFeature:
        batched, lengths = self._get_audios_and_audio_lengths(audios)
        sizes = self._get_num_audio_features(lengths)
        return BatchFeature(data={
            "input_features": self._extract_mel_spectrograms(batched, device=device),
            "audio_embed_sizes": sizes,
            "input_features_mask": torch.arange(max(sizes)).view(1, -1) < torch.tensor(sizes).view(-1, 1),
        })

    def _extract_mel_spectrograms(self, audio: torch.Tensor, device: str | None = "cpu") -> torch.Tensor:
        """``[B, frames / 2, 2 * n_mels]``: log-mel frames, an odd last frame dropped, pairs stacked."""
        kwargs = self.melspec_kwargs
        with torch.no_grad():
            logmel = log_mel(audio.to(device) if device else audio, kwargs["n_fft"], kwargs["win_length"],
                             kwargs["hop_length"], self.mel_filters)
            if logmel.shape[1] % 2 == 1:
                logmel = logmel[:, :-1]
            return logmel.reshape(audio.shape[0], -1, 2 * logmel.shape[-1])
