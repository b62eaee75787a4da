"""Pairwise A/B protocol: verdict parsing, order consistency, aggregation, the HF judge."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.evaluation.pairwise import (
    FIRST, SECOND, TIE, UNPARSEABLE, pair_outcomes, parse_verdict, summarize_pairs,
)


@pytest.mark.parametrize("text, verdict", [
    ("8 6\nAssistant 1 is more accurate.", FIRST),
    ("  \n7.5, 9\nThe second is better", SECOND),
    ("5 5\nBoth equally good", TIE),
    ("10/3", FIRST),
    ("Assistant 1 gets 8 and Assistant 2 gets 6", UNPARSEABLE),
    ("8\n6", UNPARSEABLE),
    ("", UNPARSEABLE),
    ("Response A is grounded, B hallucinates. [RESULT] A", FIRST),
    ("feedback ... [RESULT] (B)", SECOND),
    ("first try [RESULT] A ... revised: [RESULT] B", SECOND),
    ("[RESULT] TIE", TIE),
    ("[RESULT] maybe", UNPARSEABLE),
])
def test_parse_verdict_auto(text, verdict):
    assert parse_verdict(text) == verdict


def test_parse_verdict_explicit_formats():
    assert parse_verdict("9 2 [RESULT] B", "judgelm") == FIRST
    assert parse_verdict("9 2 [RESULT] B", "prometheus") == SECOND
    assert parse_verdict("9 2", "prometheus") == UNPARSEABLE
    with pytest.raises(ConfigError, match="Did you mean 'judgelm'"):
        parse_verdict("9 2", "judglm")


def test_pair_outcomes_map_both_orders_back_to_x_and_y():
    x_first = ["8 6", "3 9", "5 5", "8 6", "8 6", "junk", "[RESULT] A"]
    y_first = ["6 8", "9 3", "4 4", "8 6", "5 5", "6 8", "[RESULT] B"]
    # 1: X wins both ways; 2: Y wins both ways; 3: tie both; 4: first shown wins both
    # times (position bias) -> inconsistent; 5: X then tie -> inconsistent; 6: unparseable;
    # 7: prometheus X then X -> X wins
    assert pair_outcomes(x_first, y_first).tolist() == [0, 1, 2, 3, 3, 4, 0]
    with pytest.raises(ValueError, match="2 outputs in the X-first order but 1"):
        pair_outcomes(["1 2", "2 1"], ["1 2"])


def test_summary_on_a_hand_made_table():
    # 20 pairs: 6 X wins, 2 Y wins, 4 ties, 6 inconsistent, 2 unparseable
    codes = torch.tensor([0] * 6 + [1] * 2 + [2] * 4 + [3] * 6 + [4] * 2)
    summary = summarize_pairs(codes, resamples=500)
    assert summary.pairs == 20
    assert summary.counts == {"x_wins": 6, "y_wins": 2, "tie": 4, "inconsistent": 6, "unparseable": 2}
    assert summary.x_win.value == pytest.approx(0.30)
    assert summary.y_win.value == pytest.approx(0.10)
    assert summary.tie.value == pytest.approx(0.20)
    assert summary.consistency.value == pytest.approx(0.60)
    assert summary.unparseable.value == pytest.approx(0.10)
    assert summary.net_advantage.value == pytest.approx(0.20)  # the paper's: 30 % - 10 %
    assert summary.decided_x_win.value == pytest.approx(0.75)  # 6 / (6 + 2)
    assert summary.net_advantage_decided.value == pytest.approx(0.50)  # (6 - 2) / 8
    for estimate in (summary.x_win, summary.net_advantage, summary.decided_x_win):
        assert estimate.low <= estimate.value <= estimate.high and estimate.low < estimate.high
    rows = dict(summary.rows("LEAF", "GRPO"))
    assert rows["win LEAF (%)"].startswith("30.00 [") and rows["net adv. (pp)"].startswith("20.00 [")


def test_summary_reproduces_the_papers_librisqa_row():
    # Table tab:pairwise, JudgeLM / LibriSQA / Granite 3 2B: 2620 pairs, 11.4 / 3.8 / 64.8 %
    counts = {0: 299, 1: 100, 2: 1698}
    inconsistent = 2620 - sum(counts.values())
    codes = torch.tensor(sum(([c] * k for c, k in counts.items()), []) + [3] * inconsistent)
    summary = summarize_pairs(codes, resamples=200)
    assert round(100 * summary.x_win.value, 1) == 11.4
    assert round(100 * summary.consistency.value, 1) == 80.0
    assert round(100 * summary.net_advantage.value, 1) == 7.6
    assert round(100 * summary.decided_x_win.value, 1) == 74.9  # the paper prints 75.1 from unrounded counts


def test_no_decided_pair_gives_nan_not_an_error():
    summary = summarize_pairs(torch.tensor([2, 3, 4]), resamples=50)
    assert summary.net_advantage.value == 0.0
    assert summary.decided_x_win.value != summary.decided_x_win.value  # NaN


def _tiny_judge(directory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from leaf_plugins.backbones.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["<eos>", "<pad>"], eos_token="<eos>", pad_token="<pad>", vocab_size=300)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def test_judge_pairs_runs_a_real_causal_lm_in_both_orders(tmp_path):
    from dataclasses import replace

    from leaf_plugins.evaluation.judge import PAIRWISE_DECODING, PairItem, build_prompt, judge_pairs

    _tiny_judge(tmp_path)
    items = [PairItem("what city", "berlin", "berlin", "paris"),
             PairItem("which colour", "blue", "green", "blue"),
             PairItem("how many", "three", "three", "three four")]
    run = judge_pairs(str(tmp_path), items, decoding=replace(PAIRWISE_DECODING, max_new_tokens=6, batch_size=4))
    assert len(run.outputs_x_first) == len(run.outputs_y_first) == 3
    assert run.prompts_x_first[1] == build_prompt(items[1], x_first=True)
    first, second = run.prompts_y_first[0].index("paris"), run.prompts_y_first[0].rindex("berlin")
    assert first < second  # Y's answer is shown as Assistant 1 in the swapped order
    assert run.codes.tolist() == pair_outcomes(run.outputs_x_first, run.outputs_y_first, "judgelm").tolist()
    assert sum(run.summary.counts.values()) == 3
    again = judge_pairs(str(tmp_path), items, decoding=replace(PAIRWISE_DECODING, max_new_tokens=6, batch_size=2))
    assert again.outputs_x_first == run.outputs_x_first  # greedy: batching does not change outputs
    with pytest.raises(ConfigError, match="decodes greedily"):
        judge_pairs(str(tmp_path), items, decoding=replace(PAIRWISE_DECODING, samples=2, temperature=0.7))
    with pytest.raises(ConfigError, match="could not be loaded"):
        judge_pairs(str(tmp_path / "missing"), items)
