"""Text metrics: BLEU through sacrebleu, ROUGE through rouge-score, unavailable metrics."""

from __future__ import annotations

import importlib.util

import pytest
from sacrebleu.metrics import BLEU

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.evaluation import text_metrics as tm

PREDICTIONS = ["The cat sat on the mat", "a dog ran home", "hello"]
REFERENCES = ["the cat sat on a mat", "the dog ran away", "hello there"]


def test_corpus_bleu_is_case_insensitive_sacrebleu_by_default():
    expected = BLEU(lowercase=True).corpus_score(PREDICTIONS, [REFERENCES]).score
    assert tm.corpus_bleu(PREDICTIONS, REFERENCES) == pytest.approx(expected)
    assert tm.corpus_bleu(["The Cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    assert tm.corpus_bleu(["The Cat sat on the mat"], ["the cat sat on the mat"], lowercase=False) < 100.0


def test_sentence_bleu_per_item():
    scores = tm.sentence_bleu(["the cat sat", "xyz"], ["The cat sat", "abc"])
    assert scores[0] == pytest.approx(100.0) and scores[1] == pytest.approx(0.0)


def test_mean_length_counts_whitespace_tokens():
    assert tm.mean_length(["a b  c", "", "one\ttwo"]) == pytest.approx((3 + 0 + 2) / 3)


@pytest.mark.skipif(importlib.util.find_spec("rouge_score") is None, reason="rouge-score not installed")
def test_rouge_by_hand():
    # prediction "a dog ran home" vs reference "the dog ran away": 2 shared unigrams of 4 and 4
    # -> R1 F = 0.5; bigrams: "dog ran" shared, 1 of 3 -> R2 F = 1/3; LCS "dog ran" -> RL = 0.5
    scores = tm.rouge(["a dog ran home"], ["the dog ran away"])
    assert scores["rouge1"] == pytest.approx(50.0)
    assert scores["rouge2"] == pytest.approx(100 / 3)
    assert scores["rougeL"] == pytest.approx(50.0)


def test_missing_packages_are_unavailable_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(tm.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("rouge_score", "nltk", "bert_score") else real(name, *a))
    result = tm.evaluate_texts(PREDICTIONS, REFERENCES)
    assert isinstance(result["bleu"], float) and isinstance(result["length"], float)
    for name, command in (("rouge1", "pip install rouge-score"), ("meteor", "nltk.downloader wordnet"),
                          ("bertscore_f1", "pip install bert-score")):
        value = result[name]
        assert isinstance(value, tm.Unavailable)
        assert command in value.install
        printed = f"{value:.2f}"
        assert printed.startswith("unavailable") and command in printed


def test_metrics_come_in_report_order_and_unknown_names_are_refused():
    result = tm.evaluate_texts(PREDICTIONS, REFERENCES, metrics=["length", "bleu"])
    assert list(result) == ["bleu", "length"]
    with pytest.raises(ConfigError, match="Did you mean 'meteor'"):
        tm.evaluate_texts(PREDICTIONS, REFERENCES, metrics=["metor"])
    with pytest.raises(ValueError, match="3 predictions for 2 references"):
        tm.corpus_bleu(PREDICTIONS, REFERENCES[:2])


def test_average_over_runs_gives_mean_and_sample_std():
    missing = tm.Unavailable("meteor", "no data", "x")
    runs = [{"bleu": 10.0, "meteor": missing}, {"bleu": 14.0, "meteor": missing}, {"bleu": 18.0, "meteor": missing}]
    averaged = tm.average_runs(runs)
    assert averaged["bleu"].mean == pytest.approx(14.0)
    assert averaged["bleu"].std == pytest.approx(4.0)  # sqrt(((-4)^2 + 0 + 4^2) / 2)
    assert (averaged["bleu"].low, averaged["bleu"].high, averaged["bleu"].runs) == (10.0, 18.0, 3)
    assert averaged["meteor"] is missing
    with pytest.raises(ValueError, match="run 1 has no metric 'bleu'"):
        tm.average_runs([{"bleu": 1.0}, {}])
