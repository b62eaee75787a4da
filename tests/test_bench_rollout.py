"""``leaf bench rollout``: the floor's arithmetic by hand, the tables, and a small
measured run (the speed itself is measured by the command, never asserted here)."""

from __future__ import annotations

import pytest

from leaf_plugins.backbones.granite_speech import tiny_granite_speech
from dataclasses import replace

from leaf_plugins.bench.rollout import (cpu_shapes, decode_bytes, measure_rollout, mismatch_table, profile_table,
                                        rollout_table)
from leaf_plugins.training.lora import attach_lora


def test_decode_bytes_by_hand():
    loaded = tiny_granite_speech(0)
    model = attach_lora(loaded, rank=4, alpha=8, dropout=0.0)
    text = loaded.model.config.text_config  # 2 layers, hidden 48, 4 heads over 2 key/value heads, tied head
    layer = 4 * (2 * 48 * 48 + 2 * 48 * 24) + 4 * (3 * 48 * 96) + 4 * 2 * 48  # q, o, k, v; gate, up, down; 2 norms
    lora = 4 * 4 * ((48 + 48) + (48 + 24) + (48 + 24) + (48 + 48) + 3 * (48 + 96))  # A and B of the 7 linears, rank 4
    head = 4 * text.vocab_size * 48 + 4 * 48  # the output head (tied to the embedding) and the final norm
    reads = decode_bytes(model, prompts=3, rows=12, prompt_width=50, new_tokens=10)
    assert reads["weights"] == 2 * (layer + lora) + head
    per_position = 2 * 2 * 2 * 12 * 4  # keys and values, 2 layers, 2 key/value heads of 12, float32
    assert reads["kv_standard"] == per_position * 12 * (50 + 5)
    assert reads["kv_shared"] == per_position * (3 * 50 + 12 * 5)
    assert reads["kv_shared_graph"] == per_position * (3 * 50 + 12 * 9)


def row(backbone: str, generate: float, static: float) -> dict:
    return {"backbone": backbone, "size": "tiny", "device_name": "CPU", "prompts": 6, "group_size": 8,
            "new_tokens": 48, "prompt_width": 101, "ms_per_token": {"generate": generate, "static": static},
            "peak_above_model": {"generate": 3e6, "static": 2e9}, "bandwidth": 10e9,
            "static_phases": {"prefill_ms": 30.0, "decode_ms_per_step": 2.5, "capture_ms": 12.0},
            "bytes": {"weights": 6e6, "kv_standard": 4e6, "kv_shared": 1e6, "kv_shared_graph": 2e6},
            "mismatch": {"generate": {"tokens": 100, "max": 0.05, "mean": 0.002, "outside": 0.0},
                         "static": {"tokens": 90, "max": 0.3, "mean": 0.02, "outside": 0.003}}}


def test_tables():
    table = rollout_table([row("qwen2-audio", 12.0, 4.0)])
    # floor: (6 MB + 4 MB) / 10 GB/s = 1 ms per token; 48 rows: 48 000 / 12 ms = 4000 tokens/s
    assert ("| qwen2-audio (tiny) | CPU | 6×8 × 48 | generate | 12.00 | 12.0× | 4000 | 1.00× | – | – | – | "
            "3.0 MB |") in table
    assert ("| qwen2-audio (tiny) | CPU | 6×8 × 48 | static | 4.00 | 4.0× | 12000 | 3.00× | 2.50 (2.5×) | 30.0 | "
            "12.0 | 2.00 GB |") in table
    assert "floor 1.000 ms per token (0.700 ms with the shared-prefix reads)" in table
    mismatch = mismatch_table([row("qwen2-audio", 12.0, 4.0)])
    assert "| qwen2-audio (tiny, bf16) | static | 90 | 0.3000 | 0.0200 | 0.30% |" in mismatch


@pytest.mark.slow  # a subprocess run of seconds
def test_a_small_run_measures_both_backends():
    result = measure_rollout(replace(cpu_shapes(repeats=1, quick=True)[0], profile=True))
    phases = result["static_phases"]
    assert phases["prefill_ms"] > 0 and phases["decode_ms_per_step"] > 0 and phases["capture_ms"] is None  # no graph
    assert result["static_fallback"] is None
    profiled = result["profile"]
    assert profiled["total_ms_per_step"] > 0 and "weight matmuls (2-D: projections, LoRA, head)" in profiled["categories"]
    assert "ms per step" in profile_table([{**result, "size": "tiny", "device_name": "CPU"}])
    assert set(result["ms_per_token"]) == {"generate", "static"} and min(result["ms_per_token"].values()) > 0
    assert result["bandwidth"] > 0 and result["bytes"]["weights"] > 0
    assert all(value >= 0 for value in result["peak_above_model"].values())
    for found in result["mismatch"].values():
        assert found["tokens"] > 0 and 0 <= found["mean"] <= found["max"] and 0 <= found["outside"] <= 1
