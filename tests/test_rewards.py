"""The built-in rewards, registered through the plugin host."""

from __future__ import annotations

import pytest

from leaf_plugins import get_host


def test_sentence_bleu_is_sacrebleu_over_100_and_case_sensitive_by_default():
    bleu = get_host().rewards.get("sentence_bleu")
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == [pytest.approx(1.0)]
    # 4 of 6 unigrams, 2 of 5 bigrams ... : compare with sacrebleu's own sentence score
    from sacrebleu.metrics import BLEU

    expected = BLEU(effective_order=True).sentence_score("The cat sat there", ["the cat sat on the mat"]).score / 100
    assert bleu(["The cat sat there"], ["the cat sat on the mat"]) == [pytest.approx(expected)]
    lowered = get_host().rewards.get("sentence_bleu_lowercase")(["The Cat"], ["the cat"])
    assert lowered == [pytest.approx(1.0)] and bleu(["The Cat"], ["the cat"])[0] < 1.0


def test_exact_match_normalises_case_punctuation_and_spaces():
    match = get_host().rewards.get("exact_match")
    assert match(["  Paris. ", "paris", "Lyon"], ["paris", "PARIS!", "Paris"]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        match(["a", "b"], ["a"])
