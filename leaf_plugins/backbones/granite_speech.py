"""Granite Speech backbones: Granite Speech 3.3 2B / 8B, Granite-4.0-1B-Speech, and a
tiny random-weight one; with a pure-torch audio front end (no torchaudio: ``granite_features``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from leaf_plugins.backbones.base import LANGUAGE_MODEL_LINEARS
from leaf_plugins.core.backbone import AUDIO_PLACEHOLDER, LoadedBackbone
from leaf_plugins.core.hookspecs import hookimpl

if TYPE_CHECKING:  # imported where used: registering the backbones (`leaf plugins`) needs no model code
    import numpy as np
    import torch
    from transformers.models.granite_speech.processing_granite_speech import GraniteSpeechProcessor

__all__ = [
    "GraniteSpeechBackbone", "merge_builtin_adapter", "tiny_granite_speech", "GRANITE_SPEECH_3_3_8B",
    "random_granite_speech_3_3_8b",
]


def merge_builtin_adapter(model: torch.nn.Module, source: str) -> None:
    """Fold the checkpoint's own speech LoRA into the base weights and remove it, so the
    model always behaves as ``generate`` runs it on audio (adapter on)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]
    if not layers:
        raise ValueError(f"{source}: the config says has_lora_adapter, but no adapter was loaded with the checkpoint")
    for name, module in layers:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, module.get_base_layer())
    model._hf_peft_config_loaded = False
    del model.peft_config
    model.config.has_lora_adapter = False


@dataclass
class GraniteSpeechBackbone:
    """A Granite Speech checkpoint (hub id or local directory), or a tiny random one."""

    hub_id: str | None
    dtype: str = "bfloat16"
    lora_targets: Any = LANGUAGE_MODEL_LINEARS
    sampling_rate: int = 16000
    build_tiny: Callable[[int], LoadedBackbone] | None = field(default=None, repr=False)

    def load(self, path: str | None = None, dtype: str | None = None, seed: int = 0) -> LoadedBackbone:
        """Load from ``path`` (hub id or directory; default ``hub_id``) or build the tiny
        model. A checkpoint that ships its own speech LoRA (Granite Speech 3.3) has it
        merged into the base weights, so that disabling *our* adapter gives the model
        users actually run (``generate`` enables that LoRA only when audio is passed)."""
        if self.build_tiny is not None and path is None:
            return self.build_tiny(seed)
        import torch
        from transformers import AutoTokenizer, GraniteSpeechForConditionalGeneration
        from transformers.models.granite_speech.processing_granite_speech import GraniteSpeechProcessor

        from leaf_plugins.backbones.granite_features import TorchGraniteSpeechFeatureExtractor

        source = path or self.hub_id
        tokenizer = AutoTokenizer.from_pretrained(source)
        features = TorchGraniteSpeechFeatureExtractor.from_pretrained(source)
        processor = GraniteSpeechProcessor(audio_processor=features, tokenizer=tokenizer)
        model = GraniteSpeechForConditionalGeneration.from_pretrained(source, dtype=getattr(torch, dtype or self.dtype))
        if model.config.has_lora_adapter:
            merge_builtin_adapter(model, source)
        return LoadedBackbone(model=model, processor=processor, tokenizer=tokenizer, spec=self)

    def build_inputs(self, loaded: LoadedBackbone, prompts: Sequence[str], audios: Sequence[np.ndarray]) -> dict:
        """Chat-templated prompts (``<|audio|>`` is Granite's own token, expanded by the
        processor to one per projector output), left padded, with the audio features."""
        import numpy as np
        import torch

        texts = [self.prompt_text(loaded, prompt) for prompt in prompts]
        loaded.tokenizer.padding_side = "left"
        batch = loaded.processor(text=texts, audio=[torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in audios],
                                 return_tensors="pt", padding=True)
        return {key: value for key, value in batch.items() if key != "audio_embed_sizes"}

    def prompt_text(self, loaded: LoadedBackbone, prompt: str) -> str:
        if AUDIO_PLACEHOLDER not in prompt:
            raise ValueError(f"prompt has no {AUDIO_PLACEHOLDER} placeholder: {prompt!r}")
        messages = [{"role": "user", "content": prompt}]
        return loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _offline_processor(n_mels: int) -> GraniteSpeechProcessor:
    """An offline tokenizer (byte-level BPE with Granite's special tokens) and the pure-torch
    front end with ``n_mels`` mel bins (frames stacked in pairs: ``2 · n_mels`` features)."""
    from transformers.models.granite_speech.processing_granite_speech import GraniteSpeechProcessor

    from leaf_plugins.backbones.granite_features import TorchGraniteSpeechFeatureExtractor
    from leaf_plugins.backbones.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|audio|>"],
                                eos_token="<|im_end|>", pad_token="<|end_of_text|>")
    tokenizer.audio_token = "<|audio|>"
    features = TorchGraniteSpeechFeatureExtractor(n_mels=n_mels, projector_window_size=15, projector_downsample_rate=5)
    return GraniteSpeechProcessor(audio_processor=features, tokenizer=tokenizer)


def tiny_granite_speech(seed: int, vocab_size: int | None = None) -> LoadedBackbone:
    """A random-weight GraniteSpeechForConditionalGeneration (2-layer dense ``granite``
    text model, 1-layer conformer, 1-layer Q-Former) with an offline tokenizer.
    ``vocab_size`` (default: the tokenizer's) pads the embeddings and the output head to a
    real model's vocabulary (49,160 for Granite Speech 3.3), for measuring memory."""
    from transformers import GraniteSpeechConfig, GraniteSpeechForConditionalGeneration

    from leaf_plugins.backbones.tiny import seeded_model

    n_mels = 16
    processor = _offline_processor(n_mels)
    tokenizer = processor.tokenizer
    config = GraniteSpeechConfig(
        text_config=dict(model_type="granite", vocab_size=vocab_size or len(tokenizer),
                         hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.2),
        encoder_config=dict(input_dim=2 * n_mels, num_layers=1, hidden_dim=32, feedforward_mult=2, num_heads=2,
                            dim_head=16, output_dim=8, context_size=50, max_pos_emb=64, dropout=0.0,
                            conv_kernel_size=5),
        projector_config=dict(model_type="blip_2_qformer", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, encoder_hidden_size=32, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|audio|>"),
        has_lora_adapter=False,
        window_size=15,
        downsample_rate=5,
    )
    model = seeded_model(GraniteSpeechForConditionalGeneration, config, tokenizer, seed)
    return LoadedBackbone(model=model, processor=processor, tokenizer=tokenizer, spec=TINY)


GRANITE_SPEECH_3_3_8B = dict(
    text_config=dict(model_type="granite", vocab_size=49_160, hidden_size=4096, intermediate_size=12_800,
                     num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=131_072, rope_theta=10_000_000.0, tie_word_embeddings=True,
                     embedding_multiplier=12.0, logits_scaling=16.0, residual_multiplier=0.22,
                     attention_multiplier=0.0078125),
    encoder_config=dict(input_dim=160, num_layers=16, hidden_dim=1024, feedforward_mult=4, num_heads=8, dim_head=128,
                        context_size=200, conv_kernel_size=15, dropout=0.0),
    projector_config=dict(model_type="blip_2_qformer", hidden_size=1024, num_hidden_layers=2, num_attention_heads=16,
                          intermediate_size=4096, encoder_hidden_size=1024, cross_attention_frequency=1),
    window_size=15,
    downsample_rate=5,
)
"""Granite Speech 3.3 8B's shapes as its published ``config.json`` gives them (the
granite-3.3-8b-instruct language model, the 16-layer conformer of revision 3.3.2, the
2-layer Q-Former), its built-in speech LoRA left out (the backbone merges it into the
base weights on load, see ``merge_builtin_adapter``)."""


def random_granite_speech_3_3_8b(seed: int, device: str, dtype: torch.dtype) -> LoadedBackbone:
    """A random-weight Granite Speech 3.3 8B built directly on ``device`` in ``dtype`` with
    the offline tokenizer: for measuring a training step at the real size without a
    download. Its texts are meaningless; its tensors are real."""
    from transformers import GraniteSpeechConfig, GraniteSpeechForConditionalGeneration

    from leaf_plugins.backbones.tiny import random_model_on

    processor = _offline_processor(n_mels=80)
    config = GraniteSpeechConfig(**GRANITE_SPEECH_3_3_8B, has_lora_adapter=False,
                                 audio_token_index=processor.tokenizer.convert_tokens_to_ids("<|audio|>"))
    model = random_model_on(GraniteSpeechForConditionalGeneration, config, processor.tokenizer, seed, device, dtype)
    return LoadedBackbone(model=model, processor=processor, tokenizer=processor.tokenizer, spec=PAPER_SIZE)


TINY = GraniteSpeechBackbone(hub_id=None, dtype="float32", build_tiny=tiny_granite_speech)
PAPER_SIZE = GraniteSpeechBackbone(hub_id=None)  # the spec of ``random_granite_speech_3_3_8b``


@hookimpl
def register_backbones(register) -> None:  # type: ignore[no-untyped-def]
    register("granite-speech-3.3-2b", GraniteSpeechBackbone(hub_id="ibm-granite/granite-speech-3.3-2b"))
    register("granite-speech-3.3-8b", GraniteSpeechBackbone(hub_id="ibm-granite/granite-speech-3.3-8b"))
    register("granite-4.0-1b-speech", GraniteSpeechBackbone(hub_id="ibm-granite/granite-4.0-1b-speech"))
    register("tiny-granite-speech", TINY)
