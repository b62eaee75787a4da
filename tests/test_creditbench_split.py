"""The credit benchmark's design/report split: disjoint, covering what it promises, and
a paired report whose differences are those of the cosines."""

from __future__ import annotations

from dataclasses import replace

import torch

from leaf_plugins.bench.credit import split
from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.credit.measures import measure_credit
from leaf_plugins.bench.credit.sampling import sample_groups
from leaf_plugins.bench.estimator_choice import EstimatorChoice


def test_the_report_set_is_disjoint_from_the_design_set_and_covers_its_promise():
    report = split.report_regimes()
    names = [regime.name for regime in report]
    assert len(set(names)) == len(names)
    assert not set(names) & set(split.design_regime_names())
    assert {regime.group_size for regime in report} == {4, 8, 16}
    assert {regime.reward for regime in report} == {"additive", "graded", "exact"}
    assert any(regime.reference_length is None for regime in report)  # fixed length
    assert any(regime.reference_length is not None for regime in report)  # variable length
    assert any(regime.features for regime in report)  # parameters shared across states
    assert len({regime.vocab for regime in report}) >= 4
    assert {regime.batch_groups for regime in report} == {2, 4, 8}


def test_paired_report_differences_are_the_cosines_differences():
    regime = replace(split.report_regimes()[4], name="tiny")
    rows = split.paired_report([regime], EstimatorChoice("tree_otb"), baselines=("otb", "tree_otb"), seeds=1, groups=6)
    env = Environment.build(regime, 0)
    groups = sample_groups(env, 6, torch.Generator().manual_seed(0))
    own = measure_credit(env, groups, advantages_of("tree_otb", env, groups)[0]).group_cosines
    otb = measure_credit(env, groups, advantages_of("otb", env, groups)[0]).group_cosines
    difference = (own - otb)[torch.isfinite(own - otb)]
    assert abs(rows[0].minus["otb"].mean - float(difference.mean())) < 1e-12  # the same float64 values
    assert rows[0].minus["tree_otb"].mean == 0.0  # an estimator against itself
    table = split.report_table(rows)
    assert "| tiny | graded |" in table and "vs `otb`" in table


def test_report_set_command_with_regimes_batch_groups_and_parameters(tmp_path, capsys, monkeypatch):
    """The options reach the paired report: the chosen regimes at the given batch size,
    tree_otb's parameters over its defaults; the table is written."""
    from leaf_plugins.cli import main

    seen = []
    original = split.paired_report

    def recorded(chosen, estimator, **kwargs):
        seen.append(([regime.batch_groups for regime in chosen], estimator.name, dict(estimator.params)))
        return original(chosen, estimator, **kwargs)

    monkeypatch.setattr(split, "paired_report", recorded)
    arguments = ["bench", "credit", "--report-set", "--quick", "--regimes", "base", "--batch-groups", "2",
                 "--estimator", "tree_otb:tree_weight=1", "--out", str(tmp_path)]
    assert main(arguments) == 0
    assert seen == [([2], "tree_otb", {"tree_weight": 1})]
    assert "| base | graded |" in (tmp_path / "report-set.md").read_text()
    assert main(["bench", "credit", "--report-set", "--estimator", "tree_otb:tree_weigth=1"]) == 2
    assert "tree_weigth" in capsys.readouterr().err  # the misspelt parameter is named
    assert main(["bench", "credit", "--report-set", "--estimator", "otb", "--estimator", "grpo"]) == 2
    assert "reports one estimator" in capsys.readouterr().err
    assert main(["bench", "credit", "--report-set", "--batch-groups", "0"]) == 2
    assert "--batch-groups must be at least 1, got 0" in capsys.readouterr().err


def test_significance_needs_the_interval_to_clear_zero_beyond_rounding():
    from leaf_plugins.bench.credit.measures import Interval

    assert split.significant(Interval(0.0013, 0.0004, 10)) == 1
    assert split.significant(Interval(-0.0013, 0.0004, 10)) == -1
    assert split.significant(Interval(1e-8, 1e-9, 10)) == 0  # agreement to float rounding
    assert split.significant(Interval(0.0005, 0.0010, 10)) == 0
