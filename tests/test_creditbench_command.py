"""``leaf bench credit`` end to end on a quick setting."""

from __future__ import annotations

import csv

import pytest

from leaf_plugins.cli import main
from written_files import run_naming_every_file_written


def test_credit_benchmark_writes_table_csv_and_plots(tmp_path, capsys):
    out = run_naming_every_file_written(["bench", "credit", "--quick", "--out", str(tmp_path), "--regimes", "base",
                                         "exact match"], tmp_path, capsys)
    for name in ("grpo", "leaf", "collision", "full_tree", "otb", "tree_rloo", "tree_otb", "oracle (true Q-V)"):
        assert f"| base | {name} |" in out
        assert f"| exact match | {name} |" in out
    with (tmp_path / "credit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * len({row["estimator"] for row in rows}) >= 16
    oracle = next(row for row in rows if row["estimator"].startswith("oracle") and row["regime"] == "base")
    grpo = next(row for row in rows if row["estimator"] == "grpo" and row["regime"] == "base")
    assert float(oracle["token_correlation"]) > 0.999  # the oracle's credit is the truth itself
    assert float(oracle["cosine"]) > float(grpo["cosine"])  # exact credit has the least variance
    assert float(oracle["projection"]) == pytest.approx(1.0, abs=4 * float(oracle["projection_ci"]) + 0.02)
    otb = next(row for row in rows if row["estimator"] == "otb" and row["regime"] == "base")
    assert float(otb["cosine_minus_otb"]) != float(otb["cosine_minus_otb"])  # NaN: no pairing with itself
    assert "| J after learning, normalised | J, direction | J, adam | J − grpo, paired" in out
    # the paired learning difference is the mean over seeds of the two curves' final J difference
    tree_otb = next(row for row in rows if row["estimator"] == "tree_otb" and row["regime"] == "base")
    for protocol in ("normalised", "direction", "adam"):
        assert float(grpo[f"final_reward_{protocol}_minus_grpo"]) != float(grpo[f"final_reward_{protocol}_minus_grpo"])
        difference = float(tree_otb[f"final_reward_{protocol}"]) - float(grpo[f"final_reward_{protocol}"])
        assert float(tree_otb[f"final_reward_{protocol}_minus_grpo"]) == pytest.approx(difference, abs=1e-12)
    for picture in ("gradient_cosine.png", "learning_curves_normalised.png", "learning_curves_direction.png",
                    "learning_curves_adam.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_regime_is_named_with_a_suggestion(capsys):
    assert main(["bench", "credit", "--quick", "--regimes", "bse"]) == 2
    assert "unknown regime 'bse'. Did you mean 'base'?" in capsys.readouterr().err


def test_a_seed_count_below_one_is_refused(capsys):
    assert main(["bench", "credit", "--quick", "--regimes", "base", "--learning-seeds", "0"]) == 2
    assert "--learning-seeds must be at least 1, got 0" in capsys.readouterr().err


def test_a_learning_rate_that_is_not_positive_is_refused(capsys):
    assert main(["bench", "credit", "--quick", "--regimes", "base", "--learning-rate", "0"]) == 2
    assert "--learning-rate must be a positive finite number, got 0.0" in capsys.readouterr().err


def test_the_learning_rate_sets_the_normalised_protocols_step(monkeypatch, tmp_path):
    """The step options reach the settings the sweep runs with."""
    import leaf_plugins.bench.credit.sweep as sweep

    seen = []
    original = sweep.run_sweep

    def recording(settings, *rest, **options):
        seen.append(settings)
        return original(settings, *rest, **options)

    monkeypatch.setattr(sweep, "run_sweep", recording)
    assert main(["bench", "credit", "--quick", "--out", str(tmp_path), "--regimes", "base", "--learning-rate", "1.5",
                 "--direction-step", "0.5", "--adam-learning-rate", "0.01", "--learning-seeds", "3"]) == 0
    assert (seen[0].learning_rate, seen[0].direction_step, seen[0].adam_learning_rate) == (1.5, 0.5, 0.01)
    assert seen[0].learning_seeds == 3
