"""Corpus BLEU with item-bootstrap intervals: the summed per-item statistics give
sacrebleu's own corpus score, and the paired difference of a system with itself is 0."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.evaluation.bleu_interval import (bleu_from_statistics, bleu_interval, bleu_statistics,
                                                   paired_bleu_interval)
from leaf_plugins.evaluation.text_metrics import corpus_bleu

REFERENCES = ["der Hund ist groß", "die Katze wohnt in Berlin", "meine Schwester hat drei Bücher",
              "das Kind ist müde", "der Lehrer wohnt in Wien", "mein Bruder hat zwei Autos"]
PREDICTIONS = ["der Hund ist klein", "die Katze wohnt in Berlin", "meine Schwester hat Bücher",
               "das Kind", "der Lehrer wohnt in Rom", "mein Bruder hat zwei Autos"]


def test_summed_statistics_reproduce_sacrebleus_corpus_score():
    statistics = bleu_statistics(PREDICTIONS, REFERENCES)
    assert statistics.shape == (6, 10)
    assert statistics[1, :4].tolist() == [5, 4, 3, 2] and statistics[1, 8:].tolist() == [5, 5]  # exact match
    score = float(bleu_from_statistics(statistics.sum(0, keepdim=True))[0])
    assert score == pytest.approx(corpus_bleu(PREDICTIONS, REFERENCES), abs=1e-9)
    subset = [0, 2, 2, 5]  # a resample is a multiset of items
    resampled = float(bleu_from_statistics(statistics[subset].sum(0, keepdim=True))[0])
    assert resampled == pytest.approx(corpus_bleu([PREDICTIONS[i] for i in subset], [REFERENCES[i] for i in subset]))


def test_interval_contains_the_score_and_is_seeded():
    interval = bleu_interval(PREDICTIONS, REFERENCES, resamples=300, seed=3)
    assert interval.low <= interval.score <= interval.high and interval.items == 6
    assert bleu_interval(PREDICTIONS, REFERENCES, resamples=300, seed=3) == interval
    perfect = bleu_interval(REFERENCES, REFERENCES, resamples=100)
    assert (perfect.score, perfect.low, perfect.high) == (pytest.approx(100), pytest.approx(100), pytest.approx(100))


def test_paired_difference():
    same = paired_bleu_interval(PREDICTIONS, PREDICTIONS, REFERENCES, resamples=200)
    assert (same.score, same.low, same.high) == (0.0, 0.0, 0.0)
    better = paired_bleu_interval(REFERENCES, PREDICTIONS, REFERENCES, resamples=200)
    assert better.score == pytest.approx(100 - corpus_bleu(PREDICTIONS, REFERENCES))
    assert 0 <= better.low <= better.score <= better.high


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="as many predictions as references"):
        bleu_statistics(PREDICTIONS[:2], REFERENCES)
    assert torch.is_tensor(bleu_statistics(PREDICTIONS[:1], REFERENCES[:1]))


def test_per_item_statistics_do_not_flood_the_log(caplog):
    """sacrebleu logs an advice per sentence-level score; the per-item statistics of a
    corpus must not log it once per item (it filled the main job's output)."""
    import logging

    with caplog.at_level(logging.INFO):
        bleu_statistics(["the cat sat", "a dog"], ["the cat sat down", "a dog ran"])
    assert not [record for record in caplog.records if "effective_order" in record.getMessage()]
    assert logging.getLogger("sacrebleu").level == logging.NOTSET  # restored
