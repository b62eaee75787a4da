"""``leaf bench credit`` end to end on a quick setting."""

from __future__ import annotations

import csv

from leaf_plugins.bench.credit.estimators import estimator_names
from leaf_plugins.cli import main


def test_credit_benchmark_writes_table_csv_and_plots(tmp_path, capsys):
    assert main(["bench", "credit", "--quick", "--out", str(tmp_path), "--regimes", "base", "B=1"]) == 0
    out = capsys.readouterr().out
    for name in ("grpo", "leaf", "collision", "full_tree", "otb", "oracle (true Q-V)"):
        assert f"| base | {name} |" in out
        assert f"| B=1 | {name} |" in out
    with (tmp_path / "credit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * len(estimator_names())  # every registered estimator and the oracle, per regime
    oracle = next(row for row in rows if row["estimator"].startswith("oracle") and row["regime"] == "base")
    grpo = next(row for row in rows if row["estimator"] == "grpo" and row["regime"] == "base")
    assert float(oracle["token_correlation"]) > 0.999  # the oracle's credit is the truth itself
    assert float(oracle["cosine"]) > float(grpo["cosine"])  # exact credit has the least variance
    for picture in ("gradient_cosine.png", "learning_curves.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_regime_is_named_with_a_suggestion(capsys):
    assert main(["bench", "credit", "--quick", "--regimes", "bse"]) == 2
    assert "unknown regime 'bse'. Did you mean 'base'?" in capsys.readouterr().err
