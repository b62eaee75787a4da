"""Tail risk: CVaR@alpha, fraction below a threshold and bootstrap CIs, on hand-worked values."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.evaluation.tail_risk import bootstrap, cvar, fraction_below, mean, tail_risk_report


def test_cvar_is_the_mean_of_the_worst_fraction_by_hand():
    scores = [90.0, 10.0, 50.0, 30.0, 70.0, 20.0, 80.0, 60.0, 40.0, 100.0]
    assert cvar(scores, 0.1).item() == pytest.approx(10.0)  # worst 1 of 10
    assert cvar(scores, 0.3).item() == pytest.approx((10 + 20 + 30) / 3)
    assert cvar(scores, 1.0).item() == pytest.approx(55.0)  # the mean
    # alpha * n = 2.5: the two lowest in full and half of the third
    assert cvar(scores, 0.25).item() == pytest.approx((10 + 20 + 0.5 * 30) / 2.5)
    # one item below the fraction: 5 items, alpha 0.1 -> mass 0.5 of the lowest item
    assert cvar([3.0, 1.0, 2.0, 5.0, 4.0], 0.1).item() == pytest.approx(1.0)


def test_cvar_and_fraction_work_row_wise_on_resample_matrices():
    rows = torch.tensor([[4.0, 1.0, 3.0, 2.0], [8.0, 8.0, 0.0, 4.0]])
    assert cvar(rows, 0.5).tolist() == pytest.approx([1.5, 2.0])
    assert fraction_below(rows, 3.0).tolist() == pytest.approx([0.5, 0.25])
    assert fraction_below([2.0, 3.0, 4.0], 3.0).item() == pytest.approx(1 / 3)  # strictly below


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="alpha"):
        cvar([1.0, 2.0], 0.0)
    with pytest.raises(ValueError, match="NaN"):
        mean([1.0, float("nan")])
    with pytest.raises(ValueError, match="non-empty"):
        fraction_below([], 1.0)


def test_bootstrap_is_seeded_and_its_interval_covers_the_truth_and_shrinks_with_n():
    generator = torch.Generator().manual_seed(7)
    population = torch.rand(200_000, generator=generator) * 100  # uniform(0, 100)
    true_cvar10 = 5.0  # mean of uniform(0, 10)
    widths = []
    for n in (200, 5000):
        sample = population[:n]
        estimate = bootstrap(sample, lambda rows: cvar(rows, 0.1), resamples=1000, seed=3)
        assert estimate.low <= true_cvar10 <= estimate.high
        assert estimate.low <= estimate.value <= estimate.high
        widths.append(estimate.high - estimate.low)
        assert bootstrap(sample, lambda rows: cvar(rows, 0.1), resamples=1000, seed=3) == estimate
    assert widths[1] < widths[0] / 3  # ~ 1/sqrt(n): 5 times narrower expected


def test_bootstrap_interval_matches_the_normal_approximation_for_the_mean():
    generator = torch.Generator().manual_seed(11)
    sample = torch.randn(4000, generator=generator, dtype=torch.float64) * 10 + 60
    estimate = bootstrap(sample, mean, resamples=1000, seed=0)
    half = 1.96 * sample.std().item() / 4000 ** 0.5
    assert estimate.value == pytest.approx(sample.mean().item())
    assert (estimate.high - estimate.low) / 2 == pytest.approx(half, rel=0.15)


def test_tail_risk_report_has_the_papers_columns():
    scores = torch.arange(100, dtype=torch.float64)  # 0 … 99
    report = tail_risk_report(scores, resamples=200)
    assert list(report) == ["mean", "cvar@10", "cvar@25", "frac<50"]
    assert report["mean"].value == pytest.approx(49.5)
    assert report["cvar@10"].value == pytest.approx(4.5)  # mean of 0 … 9
    assert report["cvar@25"].value == pytest.approx(12.0)  # mean of 0 … 24
    assert report["frac<50"].value == pytest.approx(0.5)
    assert str(report["cvar@10"]).startswith("4.50 [")
