"""Granite Speech backbones on tiny random-weight instances of the real class, and the
pure-torch audio front end against a slow, explicit reference."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from leaf_plugins import get_host
from leaf_plugins.backbones.granite_features import TorchGraniteSpeechFeatureExtractor
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.training.lora import attach_lora, reference_policy
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.teacher_forcing import response_logprobs


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def slow_log_mel(audio: np.ndarray, n_fft=512, win_length=400, hop=160, n_mels=80, rate=16000) -> np.ndarray:
    """Explicit DFT of centred, reflect-padded frames; HTK triangles; Granite's scaling."""
    padded = np.pad(audio.astype(np.float64), n_fft // 2, mode="reflect")
    window = np.zeros(n_fft)
    offset = (n_fft - win_length) // 2
    window[offset : offset + win_length] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win_length) / win_length)
    frames = 1 + len(audio) // hop
    bins = np.arange(n_fft // 2 + 1)
    dft = np.exp(-2j * np.pi * np.outer(bins, np.arange(n_fft)) / n_fft)
    power = np.stack([np.abs(dft @ (padded[f * hop : f * hop + n_fft] * window)) ** 2 for f in range(frames)])
    mel = lambda hz: 2595 * math.log10(1 + hz / 700)  # noqa: E731
    edges = [700 * (10 ** (m / 2595) - 1) for m in np.linspace(0, mel(rate / 2), n_mels + 2)]
    freqs = np.linspace(0, rate // 2, n_fft // 2 + 1)
    filters = np.zeros((len(freqs), n_mels))
    for j in range(n_mels):
        low, centre, high = edges[j], edges[j + 1], edges[j + 2]
        for i, f in enumerate(freqs):
            filters[i, j] = max(0.0, min((f - low) / (centre - low), (high - f) / (high - centre)))
    logmel = np.log10(np.clip(power @ filters, 1e-10, None))
    return np.maximum(logmel, logmel.max() - 8) / 4 + 1


def test_torch_log_mel_matches_the_explicit_reference():
    audio = clip(0.3, seed=4)
    features = TorchGraniteSpeechFeatureExtractor()
    got = features([audio])["input_features"][0].double().numpy()  # [frames/2, 160]
    expected = slow_log_mel(audio)
    expected = expected[: expected.shape[0] // 2 * 2].reshape(-1, 160)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() < 1e-4


@pytest.fixture(scope="module")
def tiny():
    backbone = get_host().backbones.get("tiny-granite-speech")
    return backbone, backbone.load(seed=0)


def test_audio_tokens_follow_the_projector_windows(tiny):
    backbone, loaded = tiny
    inputs = backbone.build_inputs(loaded, ["<|audio|> one", "two <|audio|>"], [clip(1.0), clip(2.3)])
    audio_id = loaded.model.config.audio_token_index
    # mel frames = samples // 160 + 1; encoder frames = half; windows of 15, 3 outputs each
    expected = [math.ceil((n // 160 + 1) // 2 / 15) * 3 for n in (16000, 36800)]
    assert (inputs["input_ids"] == audio_id).sum(dim=1).tolist() == expected
    text = backbone.prompt_text(loaded, "<|audio|> one")
    assert text.startswith("<|im_start|>user\n<|audio|> one<|im_end|>")


def test_rollout_and_teacher_forcing_agree_on_granite(tiny):
    backbone, loaded = tiny
    inputs = backbone.build_inputs(loaded, ["<|audio|> translate", "<|audio|> who?"], [clip(1.0), clip(1.5, 1)])
    loaded.model.eval()
    torch.manual_seed(0)
    rollout = sample_responses(RolloutRequest(loaded.model, loaded, inputs, group_size=4, max_new_tokens=10))
    with torch.no_grad():
        forced = response_logprobs(loaded.model, inputs, rollout.batch.tokens, rollout.batch.lengths, rollout.prompt_index)
    assert torch.allclose(forced, rollout.batch.logprobs, atol=1e-4)


def save_checkpoint(loaded, directory, with_speech_adapter: bool):
    """A checkpoint laid out like the hub's: base weights, processor files and, for
    Granite Speech 3.3, its own speech LoRA beside them."""
    base = copy.deepcopy(loaded.model).eval()
    base.config.has_lora_adapter = with_speech_adapter
    base.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    loaded.processor.audio_processor.save_pretrained(directory)
    if not with_speech_adapter:
        return base
    speech = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False)).eval()
    speech.save_pretrained(directory)
    return speech


@pytest.mark.parametrize("name, with_adapter", [("granite-speech-3.3-2b", True), ("granite-4.0-1b-speech", False)])
def test_loading_path_and_the_reference_policy(tiny, tmp_path, name, with_adapter):
    backbone, loaded = tiny
    original = save_checkpoint(loaded, tmp_path, with_adapter)  # what users run (speech adapter on)
    inputs = backbone.build_inputs(loaded, ["<|audio|> who?"], [clip(1.0)])
    real = get_host().backbones.get(name)
    reloaded = real.load(path=str(tmp_path), dtype="float32")
    assert not reloaded.model.config.has_lora_adapter  # a built-in adapter is merged away
    reloaded.model.eval()
    with torch.no_grad():
        expected = original(**inputs).logits
        assert torch.allclose(reloaded.model(**inputs).logits, expected, atol=1e-4)
        model = attach_lora(reloaded, rank=4, alpha=8, dropout=0.0)
        for module in model.modules():  # make our adapter matter, then switch it off
            if hasattr(module, "lora_B"):
                for weight in module.lora_B.values():
                    weight.weight.fill_(0.05)
        assert not torch.allclose(model(**inputs).logits, expected, atol=1e-3)
        with reference_policy(model):
            assert torch.allclose(model(**inputs).logits, expected, atol=1e-4)
    wrapped = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    assert wrapped and all("language_model" in n for n in wrapped)
