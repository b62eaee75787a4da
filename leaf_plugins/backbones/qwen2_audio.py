"""Qwen2-Audio backbones: Qwen2-Audio-7B, -Instruct, and a tiny random-weight one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from leaf_plugins.backbones.base import LANGUAGE_MODEL_LINEARS
from leaf_plugins.core.backbone import AUDIO_PLACEHOLDER, LoadedBackbone
from leaf_plugins.core.hookspecs import hookimpl

if TYPE_CHECKING:  # imported where used: registering the backbones (`leaf plugins`) needs no model code
    import numpy as np
    import torch
    from transformers import Qwen2AudioProcessor

__all__ = ["Qwen2AudioBackbone", "QWEN_AUDIO_TEXT", "QWEN2_AUDIO_7B_TEXT", "random_qwen2_audio_7b", "tiny_qwen2_audio"]

QWEN_AUDIO_TEXT = "<|audio_bos|><|AUDIO|><|audio_eos|>"
"""What ``<|audio|>`` becomes in a Qwen2-Audio prompt; the processor expands ``<|AUDIO|>``."""


@dataclass
class Qwen2AudioBackbone:
    """A Qwen2-Audio checkpoint (hub id or local directory), or a tiny random one."""

    hub_id: str | None
    chat: bool  # the -Instruct model takes a chat template; the base model a plain prompt
    dtype: str = "bfloat16"
    lora_targets: Any = LANGUAGE_MODEL_LINEARS
    sampling_rate: int = 16000
    build_tiny: Callable[[int], LoadedBackbone] | None = field(default=None, repr=False)

    def load(self, path: str | None = None, dtype: str | None = None, seed: int = 0) -> LoadedBackbone:
        """Load from ``path`` (a hub id or a local directory; default ``hub_id``), or build
        the tiny random-weight model from ``seed``."""
        if self.build_tiny is not None and path is None:
            return self.build_tiny(seed)
        import torch
        from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

        source = path or self.hub_id
        processor = AutoProcessor.from_pretrained(source)
        model = Qwen2AudioForConditionalGeneration.from_pretrained(source, dtype=getattr(torch, dtype or self.dtype))
        return LoadedBackbone(model=model, processor=processor, tokenizer=processor.tokenizer, spec=self)

    def build_inputs(
        self, loaded: LoadedBackbone, prompts: Sequence[str], audios: Sequence[np.ndarray]
    ) -> dict[str, torch.Tensor]:
        """Prompts with ``<|audio|>`` rewritten, the chat template applied (Instruct),
        left-padded and tokenised with the audio features."""
        texts = [self.prompt_text(loaded, prompt) for prompt in prompts]
        loaded.tokenizer.padding_side = "left"
        batch = loaded.processor(
            text=texts, audio=list(audios), sampling_rate=self.sampling_rate, return_tensors="pt", padding=True
        )
        return dict(batch)

    def prompt_text(self, loaded: LoadedBackbone, prompt: str) -> str:
        """The text the model reads for one task prompt."""
        if AUDIO_PLACEHOLDER not in prompt:
            raise ValueError(f"prompt has no {AUDIO_PLACEHOLDER} placeholder: {prompt!r}")
        text = prompt.replace(AUDIO_PLACEHOLDER, QWEN_AUDIO_TEXT)
        if not self.chat:
            return text
        messages = [{"role": "user", "content": text}]
        return loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _offline_processor(clip_seconds: int, mel_bins: int) -> Qwen2AudioProcessor:
    """An offline tokenizer (byte-level BPE with Qwen2-Audio's special tokens) and a
    Whisper front end of ``mel_bins`` bins that pads clips to ``clip_seconds``."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    from leaf_plugins.backbones.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.audio_token, tokenizer.audio_bos_token, tokenizer.audio_eos_token = (
        "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
    )
    features = WhisperFeatureExtractor(
        feature_size=mel_bins, sampling_rate=16000, hop_length=160, chunk_length=clip_seconds, n_fft=400
    )
    return Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokenizer)


def tiny_qwen2_audio(seed: int, clip_seconds: int = 8, vocab_size: int | None = None) -> LoadedBackbone:
    """A random-weight Qwen2AudioForConditionalGeneration with 2 small layers and an
    offline tokenizer; clips up to ``clip_seconds`` (the Whisper front end pads to it).
    ``vocab_size`` (default: the tokenizer's) pads the embeddings and the output head to a
    real model's vocabulary (156,032 for Qwen2-Audio-7B), for measuring memory."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    from leaf_plugins.backbones.tiny import seeded_model

    mel_bins = 16
    processor = _offline_processor(clip_seconds, mel_bins)
    tokenizer = processor.tokenizer
    config = Qwen2AudioConfig(
        audio_config=dict(
            num_mel_bins=mel_bins, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
            max_source_positions=clip_seconds * 50,  # the mel input must be exactly 2 × this many frames
        ),
        text_config=dict(
            model_type="qwen2", vocab_size=vocab_size or len(tokenizer), hidden_size=48, intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
            initializer_range=0.2,  # peaked like a trained LM (0.02 gives near-uniform logits LoRA can hardly move)
        ),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
    )
    model = seeded_model(Qwen2AudioForConditionalGeneration, config, tokenizer, seed)
    return LoadedBackbone(model=model, processor=processor, tokenizer=tokenizer, spec=TINY)


QWEN2_AUDIO_7B_TEXT = dict(
    model_type="qwen2", vocab_size=156_032, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_theta=10_000.0, tie_word_embeddings=False,
)
"""Qwen2-Audio-7B's language model as its published ``config.json`` gives it; its audio
encoder is ``Qwen2AudioEncoderConfig``'s defaults (Whisper-large-v3 shape: 32 layers,
d_model 1280, 128 mel bins, 30 s)."""


def random_qwen2_audio_7b(seed: int, device: str, dtype: torch.dtype) -> LoadedBackbone:
    """A random-weight Qwen2-Audio-7B (the published shapes, 8.4 B weights) built directly
    on ``device`` in ``dtype``, with the offline tokenizer: for measuring a training step at
    the real size without a download. Its texts are meaningless; its tensors are real."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    from leaf_plugins.backbones.tiny import random_model_on

    processor = _offline_processor(clip_seconds=30, mel_bins=128)
    config = Qwen2AudioConfig(audio_config=dict(model_type="qwen2_audio_encoder"), text_config=QWEN2_AUDIO_7B_TEXT,
                              audio_token_index=processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>"))
    model = random_model_on(Qwen2AudioForConditionalGeneration, config, processor.tokenizer, seed, device, dtype)
    return LoadedBackbone(model=model, processor=processor, tokenizer=processor.tokenizer, spec=PAPER_SIZE)


TINY = Qwen2AudioBackbone(hub_id=None, chat=True, dtype="float32", build_tiny=tiny_qwen2_audio)
PAPER_SIZE = Qwen2AudioBackbone(hub_id=None, chat=True)  # the spec of ``random_qwen2_audio_7b``


@hookimpl
def register_backbones(register) -> None:  # type: ignore[no-untyped-def]
    register("qwen2-audio-7b", Qwen2AudioBackbone(hub_id="Qwen/Qwen2-Audio-7B", chat=False))
    register("qwen2-audio-7b-instruct", Qwen2AudioBackbone(hub_id="Qwen/Qwen2-Audio-7B-Instruct", chat=True))
    register("tiny-qwen2-audio", TINY)
