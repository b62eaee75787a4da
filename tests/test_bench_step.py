"""``leaf bench step``: the measured step and its tables (the speed itself is measured by
the command, never asserted here)."""

from __future__ import annotations

import pytest
import torch

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


def test_the_trainers_path_is_the_trainers_update(monkeypatch):
    """The measured update is the trainer's own ``update_policy``, on the model as the
    trainer prepares it (keyed LoRA dropout), with a run's micro-batches."""
    from leaf_plugins.training import update
    from leaf_plugins.training.keyed_dropout import KeyedDropout

    calls = []
    original = update.update_policy

    def recorded(learner, data, *args, **kwargs):
        calls.append((data.context.config.optim.micro_batch_prompts, data.rollout.batch.size,
                      any(isinstance(m, KeyedDropout) for m in learner.policy.modules())))
        return original(learner, data, *args, **kwargs)

    monkeypatch.setattr(update, "update_policy", recorded)
    measure(StepShape("new", "qwen2-audio", 1024, prompts=2, group_size=2, new_tokens=3, audio_seconds=1))
    assert calls == [(1, 4, True)]


def test_table_rows_and_ratios():
    def row(path, seconds, peak):
        return {"path": path, "backbone": "qwen2-audio", "vocab_size": 156032, "new_tokens": 25, "audio_seconds": 30,
                "seconds": {"generate": seconds, "update": 1.0}, "peaks": {}, "before": 1e9, "peak": 1e9 + peak}

    table = step_table([row("old", 7.0, 8e9), row("new", 3.0, 2e9)])
    phases = "– | 7.00 | – | – | 1.00"
    assert f"| qwen2-audio (156,032) | 30 | 25 | old | {phases} | 8.0 | 8.00 | 9.00 |" in table
    assert "old/new step time 2.0×, peak memory above the model 4.0×" in table


def test_accounting_by_hand():
    qwen = next(m for m in PAPER_MODELS if m.vocab == 156_032)
    rows = {name: (before, now) for name, _, before, now in accounting_rows(qwen)}
    before, _ = rows["rollout per-token statistics (fp32)"]
    assert before == 6 * 48 * 200 * 156_032 * 4  # 36 GB: six [N, T, V] float32 tensors
    assert "144 before" in accounting_table() and "6 now" in accounting_table()


def test_the_paper_size_models_have_the_accounted_shapes():
    """The random-weight real-size builders (built on the meta device: no memory) agree
    with the accounting's figures, which were written from the published configs."""
    from leaf_plugins.backbones.granite_speech import random_granite_speech_3_3_8b
    from leaf_plugins.backbones.qwen2_audio import random_qwen2_audio_7b

    for build, name in ((random_qwen2_audio_7b, "Qwen2-Audio-7B"), (random_granite_speech_3_3_8b, "Granite Speech 3.3 8B")):
        accounted = next(m for m in PAPER_MODELS if m.name == name)
        model = build(0, "meta", torch.bfloat16).model
        text = model.config.text_config
        assert (text.vocab_size, text.hidden_size, text.num_hidden_layers, text.num_key_value_heads) == (
            accounted.vocab, accounted.hidden, accounted.layers, accounted.kv_heads)
        assert text.hidden_size // text.num_attention_heads == accounted.head_dim
        assert round(sum(p.numel() for p in model.parameters()) / 1e9, 1) == accounted.parameters
        assert model.dtype == torch.bfloat16


def test_table_marks_checkpointing_and_a_step_that_ran_out_of_memory():
    def row(path, recompute, seconds, peak, failed=None):
        found = {"path": path, "backbone": "qwen2-audio", "vocab_size": 156032, "new_tokens": 200, "audio_seconds": 30,
                 "seconds": seconds, "peaks": {}, "before": 17e9, "peak": 17e9 + peak, "device": "cuda",
                 "device_name": "NVIDIA H100 80GB HBM3", "activation_checkpointing": recompute}
        return found | ({"out_of_memory": failed} if failed else {})

    table = step_table([row("old", True, {"generate": 30.0}, 55e9, failed="generate"),
                        row("new", True, {"generate": 30.0, "update": 10.0}, 27e9)])
    assert table.startswith("Measured on NVIDIA H100 80GB HBM3; weights bf16")
    assert "| peak allocated GB |" in table
    assert "| old + checkpointing | – | 30.00 | – | – | – | out of memory in generate | > 55.00 | 72.00 |" in table
    assert "| new + checkpointing | – | 30.00 | – | – | 10.00 | 40.0 | 27.00 | 44.00 |" in table
    assert "old/new" not in table  # no ratio against a step that did not finish


@pytest.mark.gpu
def test_a_small_step_on_the_gpu_records_allocator_peaks():
    row = measure(StepShape("new", "granite-speech", 1024, prompts=2, group_size=2, new_tokens=3, audio_seconds=1,
                            device="cuda", activation_checkpointing=True))
    assert row["peak"] >= row["before"] > 0 and "out_of_memory" not in row


def test_the_rollout_statistics_row_is_what_the_rollout_holds(monkeypatch):
    """The accounting's "now" for the per-token statistics against the tensors the rollout's
    TokenStatistics processor really keeps, at a small shape (N = 6, T = 5, V = 50)."""
    from leaf_plugins.bench import step_accounting
    from leaf_plugins.rollout.token_stats import TokenStatistics

    rows, new_tokens, vocab = 6, 5, 50
    monkeypatch.setattr(step_accounting, "PROMPTS", 3)
    monkeypatch.setattr(step_accounting, "GROUP", 2)
    monkeypatch.setattr(step_accounting, "NEW_TOKENS", new_tokens)
    small = step_accounting.ModelShape("small", vocab=vocab, hidden=8, layers=1, kv_heads=1, head_dim=8,
                                       parameters=0.0, audio_tokens=4, keeps_last_logits=True)
    (now,) = [now for name, _, _, now in step_accounting.accounting_rows(small) if name.startswith("rollout per-token")]
    statistics = TokenStatistics(temperature=0.9, top_p=0.9, suppress=[], device=torch.device("cpu"),
                                 keys=torch.arange(rows))
    generated = torch.zeros(rows, 1, dtype=torch.long)
    held = []
    for _ in range(new_tokens):
        statistics(generated, torch.randn(rows, vocab))
        generated = torch.cat([generated, torch.randint(vocab, (rows, 1))], dim=1)
        kept = [*statistics._policy, *statistics._sampling, *statistics._sum_pi_squared, *statistics._pending]
        held.append(sum(tensor.numel() * tensor.element_size() for tensor in kept))
    # the last step holds its [N, V] log π and log q and every earlier step's three [N] values:
    # the accounting's 2 N V + 3 N T floats less the last step's two values not yet taken
    assert max(held) == now - 2 * rows * 4
