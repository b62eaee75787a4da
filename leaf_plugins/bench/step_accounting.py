"""Bytes per tensor class of one training step at the paper's shapes for the real
models (6 prompts × K = 8, T = 200 new tokens, 30 s clips, bf16 weights, one prompt per
micro-batch), on the reference path and the trainer's: arithmetic from the published model configs,
not a measurement (``leaf bench step`` measures the tiny stand-ins)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelShape", "PAPER_MODELS", "accounting_rows", "accounting_table"]


@dataclass(frozen=True)
class ModelShape:
    """What the accounting needs of a real backbone (from its ``config.json``)."""

    name: str
    vocab: int
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    parameters: float  # all weights, billions
    audio_tokens: int  # language-model slots of a 30 s clip
    keeps_last_logits: bool  # its forward takes logits_to_keep, so generate's prefill projects one position
    text_tokens: int = 40  # chat template and instruction around the audio


PAPER_MODELS = (
    # Qwen-7B text model; Whisper-large-v3 encoder: 3000 mel frames → 1500 → pooled to 750 slots
    ModelShape("Qwen2-Audio-7B", vocab=156_032, hidden=4096, layers=32, kv_heads=32, head_dim=128, parameters=8.4,
               audio_tokens=750, keeps_last_logits=False),
    # granite-3.3-8b text model; conformer at 50 frames/s, Q-Former window 15 → 3 queries: 10 slots/s
    ModelShape("Granite Speech 3.3 8B", vocab=49_160, hidden=4096, layers=40, kv_heads=8, head_dim=128,
               parameters=8.6, audio_tokens=300, keeps_last_logits=True),
)

PROMPTS, GROUP, NEW_TOKENS = 6, 8, 200
FLOAT32, BF16 = 4, 2
CHUNK_BYTES = (1 << 24) * FLOAT32  # selected_logprobs converts 2^24 elements at a time


def accounting_rows(model: ModelShape) -> list[tuple[str, str, float, float]]:
    """``(tensor class, formula, bytes before, bytes now)`` for one model."""
    rows, v, t = PROMPTS * GROUP, model.vocab, NEW_TOKENS
    prompt = model.audio_tokens + model.text_tokens
    micro = GROUP  # rows of one micro-batch (one prompt and its K responses)
    return [
        ("frozen weights (bf16)", "params × 2", model.parameters * 1e9 * BF16, model.parameters * 1e9 * BF16),
        ("KV cache in generation (bf16)", "2 · layers · N · (P+T) · kv_heads · head_dim · 2",
         2 * model.layers * rows * (prompt + t) * model.kv_heads * model.head_dim * BF16,
         2 * model.layers * rows * (prompt + t) * model.kv_heads * model.head_dim * BF16),
        ("generation prefill logits (bf16)", "before N · (P or 1) · V · 2; now N · V · 2",
         rows * (1 if model.keeps_last_logits else prompt) * v * BF16, rows * v * BF16),
        # before: generate's scores and logits tuples, then stacked logits, their log-softmax,
        # and the squared-probability temporary (or the stacked scores and their log-softmax)
        ("rollout per-token statistics (fp32)", "before 6 · N·T·V · 4; now 2 · N·V · 4 + 3 · N·T · 4",
         6 * rows * t * v * FLOAT32, 2 * rows * v * FLOAT32 + 3 * rows * t * FLOAT32),
        # before: bf16 logits of every position, fp32 copy of the T predicting ones and its
        # log-softmax (kept for backward); now: bf16 logits of the T predicting positions and one chunk
        ("teacher-forced logits, one micro-batch, forward", "before K·(P+T)·V·2 + 2 · K·T·V·4; now K·T·V·2 + chunk",
         micro * (prompt + t) * v * BF16 + 2 * micro * t * v * FLOAT32, micro * t * v * BF16 + CHUNK_BYTES),
        ("teacher-forced logits, one micro-batch, backward", "before K·T·V·4 + K·(P+T)·V·2; now K·T·V·2 + chunk",
         micro * t * v * FLOAT32 + micro * (prompt + t) * v * BF16, micro * t * v * BF16 + CHUNK_BYTES),
        ("audio embeddings per step (bf16)", "clips encoded × audio slots × hidden × 2 (3 passes before, 1 now)",
         3 * rows * model.audio_tokens * model.hidden * BF16, PROMPTS * model.audio_tokens * model.hidden * BF16),
    ]


def _gb(value: float) -> str:
    return f"{value / 1e9:,.2f}"


def accounting_table() -> str:
    """Markdown: one block of rows per model, GB before and now."""
    lines = [f"Paper shapes: {PROMPTS} prompts × K = {GROUP}, T = {NEW_TOKENS}, 30 s clips, bf16, one prompt per "
             "micro-batch. GB (10⁹ bytes).", "",
             "| model | tensor class | formula | before | now |", "|---|---|---|---|---|"]
    for model in PAPER_MODELS:
        for name, formula, before, now in accounting_rows(model):
            lines.append(f"| {model.name} (V = {model.vocab:,}) | {name} | {formula} | {_gb(before)} | {_gb(now)} |")
    lines.append("")
    lines.append(f"Audio encoder forward passes per step: {3 * PROMPTS * GROUP} before (K copies in generation and in "
                 f"each teacher-forced pass), {PROMPTS} now.")
    return "\n".join(lines)
