"""The Qwen2-Audio backbone plugins, on a tiny random-weight instance of the real class."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leaf_plugins import get_host
from leaf_plugins.backbones.qwen2_audio import QWEN_AUDIO_TEXT
from leaf_plugins.rollout.prompt_embedding import language_model_of


@pytest.fixture(scope="module")
def tiny():
    backbone = get_host().backbones.get("tiny-qwen2-audio")
    return backbone, backbone.load(seed=0)


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def test_registered_backbones():
    names = get_host().backbones.names()
    assert {"qwen2-audio-7b", "qwen2-audio-7b-instruct", "tiny-qwen2-audio"} <= set(names)
    assert get_host().backbones.get("qwen2-audio-7b").hub_id == "Qwen/Qwen2-Audio-7B"


def test_placeholder_is_rewritten_and_expanded_per_clip(tiny):
    backbone, loaded = tiny
    text = backbone.prompt_text(loaded, "Listen to the audio <|audio|> and answer: who?")
    assert QWEN_AUDIO_TEXT in text and "<|audio|>" not in text
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    inputs = backbone.build_inputs(loaded, ["<|audio|> one", "two <|audio|>"], [clip(1.0), clip(2.5)])
    audio_id = loaded.model.config.audio_token_index
    counts = (inputs["input_ids"] == audio_id).sum(dim=1)
    # 100 Whisper frames a second; the encoder's convolution then its pooling halve them:
    # 1.0 s: 100 -> (100-1)//2+1 = 50 -> (50-2)//2+1 = 25; 2.5 s: 250 -> 125 -> 62
    assert counts.tolist() == [25, 62]
    assert bool((inputs["attention_mask"][:, -1] == 1).all())  # left padding
    with pytest.raises(ValueError, match="no <\\|audio\\|> placeholder"):
        backbone.prompt_text(loaded, "no audio here")


def test_loading_path_of_the_real_backbone_from_a_saved_checkpoint(tiny, tmp_path):
    """The 7B plugins' own loading code, on a checkpoint of the same class saved here."""
    _, loaded = tiny
    loaded.model.save_pretrained(tmp_path)
    loaded.processor.save_pretrained(tmp_path)
    real = get_host().backbones.get("qwen2-audio-7b-instruct")
    reloaded = real.load(path=str(tmp_path), dtype="float32")
    inputs = real.build_inputs(reloaded, ["<|audio|> what is said?"], [clip(1.0)])
    with torch.no_grad():
        expected = loaded.model.eval()(**inputs).logits
        got = reloaded.model.eval()(**inputs).logits
    assert torch.allclose(expected, got, atol=1e-5)


def test_the_tiny_model_is_deterministic_in_its_seed():
    backbone = get_host().backbones.get("tiny-qwen2-audio")
    a, b, c = backbone.load(seed=1), backbone.load(seed=1), backbone.load(seed=2)
    # found through language_model_of: its path in the state dict moved in transformers 5.10.1
    weight = "layers.0.self_attn.q_proj.weight"
    a, b, c = (language_model_of(loaded.model).state_dict()[weight] for loaded in (a, b, c))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
