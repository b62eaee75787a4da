"""The decoder's forward, written out over the model's own submodules.

``LeanDecoder`` runs the embedding, each layer's input/post-attention norms, its
``q_proj``/``k_proj``/``v_proj``/``o_proj`` and MLP, the final norm and the output head
exactly as the Hugging Face forward of the supported families does (``family.py``; the
linear layers through ``projections.py``), so peft LoRA layers (the adapter attached,
never merged) and gathered FSDP2 weights apply unchanged; what it owns is the per-token work: rotary embeddings at explicit positions
from a table computed once by the model's own rotary module, keys and values in
``KVBuffers``, grouped-query attention without repeated heads (``attention.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from leaf_plugins.rollout.decoding.attention import prompt_attention, prompt_attention_bias, shared_prefix_attention
from leaf_plugins.rollout.decoding.family import DecoderFamily
from leaf_plugins.rollout.decoding.kv_buffers import KVBuffers
from leaf_plugins.rollout.decoding.projections import (FoldedProjection, fold_copy_bytes, folded_linear,
                                                         fused_linear, projection)
from leaf_plugins.rollout.prompt_embedding import left_padded_positions

__all__ = ["LeanDecoder", "rotate", "fold_bytes"]

Call = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _LayerCalls:
    """One decoder layer's submodules as the loop calls them (``projections.py``)."""

    input_norm: Call
    query_key_value: Callable[[torch.Tensor], list[torch.Tensor]]  # the three projections of one input
    output: Call
    post_norm: Call
    mlp: Call

    @classmethod
    def of(cls, layer: torch.nn.Module, gated_mlp: bool, fold: bool,
           folds: list[FoldedProjection]) -> "_LayerCalls":
        """``fold``: one folded matrix product per input (``fused_linear``) wherever the
        layers allow it, else each projection as ``projection`` gives it; the folded
        products made are appended to ``folds``."""
        attention, mlp = layer.self_attn, layer.mlp
        query_key_value = _fused([attention.q_proj, attention.k_proj, attention.v_proj], fold, folds)
        if gated_mlp:  # the family's MLP forward, down(act(gate(x)) * up(x)), over its own projections
            gate_up = _fused([mlp.gate_proj, mlp.up_proj], fold, folds)
            down, act = _single(mlp.down_proj, fold, folds), mlp.act_fn

            def feed_forward(x: torch.Tensor) -> torch.Tensor:
                gate, up = gate_up(x)
                return down(act(gate) * up)
        else:
            feed_forward = mlp
        return cls(_norm(layer.input_layernorm, fold), query_key_value, _single(attention.o_proj, fold, folds),
                   _norm(layer.post_attention_layernorm, fold), feed_forward)


def _groups(layer: torch.nn.Module, gated_mlp: bool) -> list[list[torch.nn.Module]]:
    """The projections of ``layer`` that one folded product each replaces."""
    attention, mlp = layer.self_attn, layer.mlp
    groups = [[attention.q_proj, attention.k_proj, attention.v_proj], [attention.o_proj]]
    return groups + ([[mlp.gate_proj, mlp.up_proj], [mlp.down_proj]] if gated_mlp else [])


def fold_bytes(family: DecoderFamily) -> tuple[int, int]:
    """``(kept, transient)`` bytes a folded ``LeanDecoder`` of ``family`` allocates: the
    copies of the folded, concatenated projections it keeps, and the largest float32
    sum ``W + s·B A`` it makes while folding one projection."""
    kept, transient = 0, 0
    for layer in family.layers:
        for group in _groups(layer, family.gated_mlp):
            copy = fold_copy_bytes(group)
            kept += copy
            if copy:
                transient = max(transient, *(module.weight.numel() * 4 if type(module) is torch.nn.Linear
                                             else module.get_base_layer().weight.numel() * 4 for module in group))
    return kept, transient


def _fused(modules: list[torch.nn.Module], fold: bool,
           folds: list[FoldedProjection]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The outputs of ``modules`` (which read one input) from one folded product when
    ``fold`` and they allow it, else one call each."""
    fused = fused_linear(modules) if fold else None
    if fused is not None:
        folds.append(fused)
        return fused
    calls = [projection(module) for module in modules]
    return lambda x: [call(x) for call in calls]


def _single(module: torch.nn.Module, fold: bool, folds: list[FoldedProjection]) -> Call:
    """``module``'s output from its folded product when ``fold`` and it allows it (no
    split of a one-part output on the decode step's path), else as ``projection`` gives it."""
    folded = folded_linear(module) if fold else None
    if folded is None:
        return projection(module)
    folds.append(folded)
    return folded


def _norm(module: torch.nn.Module, fold: bool) -> Call:
    """The RMSNorm ``module`` as one ``rms_norm`` call where ``fold`` (the CPU's small
    float32 models) and it is the families' float32 RMSNorm (``weight · x / rms(x)``), else
    the module. The same value (bit for bit in float32 with torch 2.13 on the CPU
    kernels) and the same kernels underneath; what goes is the module call and the
    Python between its seven top-level operations."""
    if not (fold and hasattr(module, "variance_epsilon") and module.weight.dtype == torch.float32):
        return module
    shape = tuple(module.weight.shape)
    return lambda x: torch.nn.functional.rms_norm(x, shape, module.weight, module.variance_epsilon)


def rotate(states: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding ``x·cos + rotate_half(x)·sin`` as the Hugging Face
    ``apply_rotary_pos_emb`` computes it, with ``rotate_half(x)·sin`` taken as
    ``roll(x, d/2)·signed_sin`` (``signed_sin``: ``sin`` with its first half negated;
    ``(-a)·b == a·(-b)`` exactly, so every rounding is the same). ``cos``/``signed_sin``
    broadcast over the heads."""
    return states * cos + states.roll(states.shape[-1] // 2, dims=-1) * signed_sin


class LeanDecoder:
    """The prefill of the prompts and the one-token decode step of every row."""

    def __init__(self, family: DecoderFamily, fold: bool = False, sharing: "LeanDecoder | None" = None) -> None:
        """Build it where the weights it runs with are in place (inside
        ``gathered_for_generation`` under FSDP2): the adapter state is read here.

        :param fold: compute each layer's LoRA-folded, concatenated projection weights
            (``projections.fused_linear``: a copy of the layers' weights, ``fold_bytes``)
            and run one product per input; False runs the model's own projections.
            ``refold`` writes the copy again from the current weights.
        :param sharing: a decoder of the same model and weights whose layer calls (and
            folded copy) this one uses instead of building its own.
        """
        self.family = family
        self.embed = family.decoder.get_input_embeddings()
        self.folds: list[FoldedProjection] = []
        if sharing is not None:
            self.layers, self.final_norm, self.folds = sharing.layers, sharing.final_norm, sharing.folds
        else:
            self.layers = [_LayerCalls.of(layer, family.gated_mlp, fold, self.folds) for layer in family.layers]
            self.final_norm = _norm(family.decoder.norm, fold)
        self.cos: torch.Tensor | None = None  # [positions, d] in the model's dtype
        self.signed_sin: torch.Tensor | None = None  # [positions, d]: sin, its first half negated

    @property
    def folded(self) -> bool:
        """Whether some projections run from a folded copy."""
        return bool(self.folds)

    def refold(self) -> None:
        """Write the folded copy again, in place, from the layers' current weights (call
        once per rollout that reuses this decoder: the weights may have been updated)."""
        for folded in self.folds:
            folded.refresh()

    def prepare_positions(self, length: int, like: torch.Tensor) -> None:
        """Compute the rotary table of positions ``0 … length-1`` once, with the model's
        own rotary module (its ``inv_freq`` and scaling), in ``like``'s dtype."""
        positions = torch.arange(length, device=like.device).unsqueeze(0)  # [1, length]
        cos, sin = self.family.decoder.rotary_emb(like, position_ids=positions)
        half = sin.shape[-1] // 2
        self.cos, self.signed_sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    def _residual(self, branch: torch.Tensor) -> torch.Tensor:
        multiplier = self.family.residual_multiplier
        return branch if multiplier == 1.0 else branch * multiplier

    def _embedded(self, embeddings: torch.Tensor) -> torch.Tensor:
        multiplier = self.family.embedding_multiplier
        return embeddings if multiplier == 1.0 else embeddings * multiplier

    def prefill(self, embeddings: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                               list[torch.Tensor]]:
        """Run the prompts once: ``[P, V]`` float32 logits at their last position and,
        per layer, their ``[P, kv_heads, L, d]`` keys and values.

        :param embeddings: ``[P, L, H]`` the prompts' input embeddings (audio merged in,
            as the model's language model receives them), left padded.
        :param mask: ``[P, L]`` their attention mask; positions are ``cumsum(mask) - 1``
            as ``generate`` gives them.
        """
        family = self.family
        prompts, width, _ = embeddings.shape
        positions = left_padded_positions(mask)  # [P, L]
        cos, sin = self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)  # [P, 1, L, d]
        bias = prompt_attention_bias(mask)  # [P, 1, L, L]
        hidden = self._embedded(embeddings)
        all_keys, all_values = [], []
        for layer in self.layers:
            query, keys, values = layer.query_key_value(layer.input_norm(hidden))
            query = query.view(prompts, width, family.heads, family.head_dim).transpose(1, 2)
            keys = keys.view(prompts, width, family.kv_heads, family.head_dim).transpose(1, 2)
            values = values.view(prompts, width, family.kv_heads, family.head_dim).transpose(1, 2)
            query, keys, values = rotate(query, cos, sin), rotate(keys, cos, sin).contiguous(), values.contiguous()
            all_keys.append(keys)
            all_values.append(values)
            attended = prompt_attention(query, keys, values, bias, family.attention_scale)  # [P, L, heads·d]
            hidden = hidden + self._residual(layer.output(attended))
            hidden = hidden + self._residual(layer.mlp(layer.post_norm(hidden)))
        last = self.final_norm(hidden[:, -1])  # left padding: every prompt ends at the last position
        return family.head(last).float(), all_keys, all_values

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor, span: int,
             buffers: KVBuffers, span_positions: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row through the decoder: ``[N, V]`` float32 logits. Writes the
        token's keys and values into generated slot ``slot`` and attends over the
        prompt's prefix and the first ``span`` slots. No host synchronisation: every
        index is a device tensor.

        :param tokens: ``[N]`` the tokens fed (each row's last sample).
        :param positions: ``[N]`` their positions.
        :param slot: ``[1]`` int64, the generated slot they go to.
        :param span_positions: ``[>= span]`` int64 ``0, 1, …``: the slots after ``slot``
            are masked (a static span longer than the written slots, for a CUDA graph);
            None when ``span`` is exactly ``slot + 1``.
        """
        family = self.family
        rows = tokens.shape[0]
        cos, sin = self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)  # [N, 1, d]
        span_bias = None if span_positions is None else torch.zeros(
            span, dtype=torch.float32, device=tokens.device).masked_fill_(span_positions[:span] > slot, float("-inf"))
        hidden = self._embedded(self.embed(tokens))  # [N, H]
        for index, layer in enumerate(self.layers):
            query, keys, values = layer.query_key_value(layer.input_norm(hidden))
            query = rotate(query.view(rows, family.heads, family.head_dim), cos, sin)
            keys = rotate(keys.view(rows, family.kv_heads, family.head_dim), cos, sin)
            values = values.view(rows, family.kv_heads, family.head_dim)
            buffers.keys[index].index_copy_(2, slot, keys.unsqueeze(2))
            buffers.values[index].index_copy_(2, slot, values.unsqueeze(2))
            attended = shared_prefix_attention(query, buffers.prefix_keys[index], buffers.prefix_values[index],
                                               buffers.prefix_bias, buffers.keys[index][:, :, :span],
                                               buffers.values[index][:, :, :span], span_bias, family.attention_scale)
            hidden = hidden + self._residual(layer.output(attended))
            hidden = hidden + self._residual(layer.mlp(layer.post_norm(hidden)))
        return family.head(self.final_norm(hidden)).float()
