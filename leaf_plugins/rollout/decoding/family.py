"""Which models the static loop runs, and the constants of their decoder family.

A model is supported when its transformers classes are one of the built-in speech
families (recognised by module type, never by a name string) and its text config uses
nothing the lean decoder does not reproduce. Everything the Hugging Face forward of
these classes reads from the config is either reproduced here or refused:

* ``Qwen2AudioForConditionalGeneration`` with a ``Qwen2Model`` decoder: q/k/v biases
  (inside the model's own ``q_proj``/``k_proj``/``v_proj``), softmax scale
  ``head_dim ** -0.5``; sliding-window layers (``layer_types``) are refused.
* ``GraniteSpeechForConditionalGeneration`` with a dense ``GraniteModel`` decoder:
  ``embedding_multiplier`` (applied to every input embedding, the prompt's included),
  ``attention_multiplier`` (the softmax scale), ``residual_multiplier`` (both residual
  branches). ``logits_scaling`` is *not* applied: the speech model's forward projects
  with its own ``lm_head`` and never divides by it (only ``GraniteForCausalLM`` does),
  and the loop reproduces the forward the rollout and the loss are computed with.
* RoPE types whose cosines are a fixed function of the position (``default``,
  ``linear``, ``llama3``, ``yarn``); ``dynamic`` and ``longrope`` rescale with the
  sequence length and are refused.
* Prompt-learning peft adapters (prefix/prompt tuning) are refused; LoRA layers
  replace the linear modules in place and run unchanged.
* Models wrapped in FSDP1 (``FullyShardedDataParallel``, flat parameters) are refused;
  FSDP2 (``fully_shard``) runs (``generation_weights.gathered_for_generation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from leaf_plugins.rollout.prompt_embedding import backbone_model_of, language_model_of

__all__ = ["DecoderFamily", "decoder_family", "unsupported_reason", "STATIC_ROPE_TYPES"]

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class DecoderFamily:
    """A supported model's decoder stack, output head and family constants."""

    model_type: str  # the text config's model_type, for messages
    decoder: torch.nn.Module  # the language model (embed_tokens, layers, norm, rotary_emb)
    head: torch.nn.Module  # the output projection the model's forward applies
    layers: tuple[torch.nn.Module, ...]  # the decoder layers the forward runs
    heads: int  # query heads
    kv_heads: int  # key/value heads (grouped-query attention when fewer)
    head_dim: int
    attention_scale: float  # the softmax scale
    embedding_multiplier: float  # every input embedding is multiplied by this
    residual_multiplier: float  # both residual branches of every layer
    gated_mlp: bool  # every layer's MLP is the family's down(act(gate(x)) · up(x)), so its projections can be called


def _families() -> list[tuple[type, type, type, str]]:
    """(outer class, decoder class, MLP class, family) tuples; imported here so that a
    transformers without one of them still runs the other."""
    found = []
    try:
        from transformers import Qwen2AudioForConditionalGeneration, Qwen2Model
        from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

        found.append((Qwen2AudioForConditionalGeneration, Qwen2Model, Qwen2MLP, "qwen2"))
    except ImportError:
        pass
    try:
        from transformers import GraniteModel, GraniteSpeechForConditionalGeneration
        from transformers.models.granite.modeling_granite import GraniteMLP

        found.append((GraniteSpeechForConditionalGeneration, GraniteModel, GraniteMLP, "granite"))
    except ImportError:
        pass
    return found


def _text_config_problem(config: Any, family: str) -> str | None:
    """Why the lean decoder would not reproduce this text config, or None."""
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else None
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r} (supported: {', '.join(STATIC_ROPE_TYPES)})"
    if family == "qwen2":
        layer_types = getattr(config, "layer_types", None) or []
        if any(kind != "full_attention" for kind in layer_types):
            return "sliding-window attention layers"
    return None


def unsupported_reason(model: Any) -> str | None:
    """None when the static loop runs ``model`` (a transformers model, possibly inside
    peft/DDP/FSDP wrappers); otherwise what it does not support, naming the model type."""
    try:
        decoder_family(model)
    except TypeError as error:
        return str(error)
    return None


def decoder_family(model: Any) -> DecoderFamily:
    """The ``DecoderFamily`` of ``model``; ``TypeError`` naming the model type and the
    unsupported feature when the static loop cannot run it."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(module, FullyShardedDataParallel) for module in model.modules()):
        raise TypeError("the model is wrapped in FSDP1 (FullyShardedDataParallel), whose flat parameters the static "
                        "rollout loop cannot call layer by layer; shard it with FSDP2 (fully_shard), which the loop "
                        "supports, or use rollout.backend=generate")
    inner = backbone_model_of(model)
    text_config = getattr(getattr(inner, "config", None), "text_config", None)
    name = f"{type(inner).__name__} (text model type {getattr(text_config, 'model_type', None)!r})"
    peft_configs = getattr(model, "peft_config", None) or {}
    if any(getattr(config, "is_prompt_learning", False) for config in peft_configs.values()):
        raise TypeError(f"{name} has a prompt-learning peft adapter, which the static rollout loop does not support")
    for outer_class, decoder_class, mlp_class, family in _families():
        if not isinstance(inner, outer_class):
            continue
        decoder = language_model_of(model)
        if not isinstance(decoder, decoder_class):
            break
        config = decoder.config
        problem = _text_config_problem(config, family)
        if problem:
            raise TypeError(f"{name} uses {problem}, which the static rollout loop does not support")
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        granite = family == "granite"
        return DecoderFamily(
            model_type=config.model_type,
            decoder=decoder,
            head=inner.get_output_embeddings(),
            layers=tuple(decoder.layers[: config.num_hidden_layers]),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            attention_scale=float(config.attention_multiplier) if granite else head_dim**-0.5,
            embedding_multiplier=float(config.embedding_multiplier) if granite else 1.0,
            residual_multiplier=float(config.residual_multiplier) if granite else 1.0,
            gated_mlp=all(type(layer.mlp) is mlp_class for layer in decoder.layers[: config.num_hidden_layers]),
        )
    raise TypeError(f"{name} is not supported by the static rollout loop (it runs Qwen2-Audio with a dense qwen2 "
                    "text model and Granite Speech with a dense granite text model)")
