"""``leaf bench step``: the measured step and its tables (the speed itself is measured by
the command, never asserted here)."""

from __future__ import annotations

import pytest

from leaf_plugins.bench.step import PHASES, StepShape, measure, step_table
from leaf_plugins.bench.step_accounting import PAPER_MODELS, accounting_rows, accounting_table


@pytest.mark.parametrize("path", ["old", "new"])
def test_a_small_step_is_measured_phase_by_phase(path):
    row = measure(StepShape(path, "qwen2-audio", 1024, prompts=2, group_size=2, new_tokens=3, audio_seconds=1))
    expected = set(PHASES) - ({"encode"} if path == "old" else set())
    assert set(row["seconds"]) == expected == set(row["peaks"])
    assert all(value > 0 for value in row["seconds"].values())
    assert row["peak"] >= row["before"] > 0 and row["peak"] == max(row["peaks"].values())
    assert 0 < row["response_tokens"] <= 2 * 2 * 3


def test_table_rows_and_ratios():
    def row(path, seconds, peak):
        return {"path": path, "backbone": "qwen2-audio", "vocab_size": 156032, "new_tokens": 25, "audio_seconds": 30,
                "seconds": {"generate": seconds, "policy": 1.0}, "peaks": {}, "before": 1e9, "peak": 1e9 + peak}

    table = step_table([row("old", 7.0, 8e9), row("new", 3.0, 2e9)])
    phases = "– | 7.00 | – | – | – | 1.00 | – | –"
    assert f"| qwen2-audio (156,032) | 30 | 25 | old | {phases} | 8.0 | 8.00 | 9.00 |" in table
    assert "old/new step time 2.0×, peak memory above the model 4.0×" in table


def test_accounting_by_hand():
    qwen = next(m for m in PAPER_MODELS if m.vocab == 156_032)
    rows = {name: (before, now) for name, _, before, now in accounting_rows(qwen)}
    before, now = rows["rollout per-token statistics (fp32)"]
    assert before == 6 * 48 * 200 * 156_032 * 4  # 36 GB: six [N, T, V] float32 tensors
    assert now == 2 * 48 * 156_032 * 4 + 3 * 48 * 200 * 4
    assert "144 before" in accounting_table() and "6 now" in accounting_table()
