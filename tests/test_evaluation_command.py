"""``leaf eval``: metrics over runs, tail risk and pairwise judging from prediction files."""

from __future__ import annotations

import csv
import json

import pytest

from leaf_plugins.cli import main
from leaf_plugins.evaluation.tail_risk import cvar


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_metrics_average_runs_and_report_unavailable_metrics(tmp_path, capsys):
    refs = ["the cat sat on the mat", "a dog ran in the park"]
    one = _write(tmp_path / "run1.jsonl", [{"prediction": p, "reference": r} for p, r in zip(refs, refs)])
    two = _write(tmp_path / "run2.jsonl", [{"prediction": "the cat", "reference": refs[0]},
                                           {"prediction": "a dog ran in the park", "reference": refs[1]}])
    code = main(["eval", "metrics", "--predictions", str(one), str(two), "--metrics", "bleu", "length",
                 "bertscore_f1", "--bertscore-model", str(tmp_path / "no-model"), "--out", str(tmp_path / "out")])
    assert code == 0
    with (tmp_path / "out" / "metrics.csv").open() as handle:
        rows = {row["metric"]: row for row in csv.DictReader(handle)}
    assert float(rows["length"]["mean"]) == pytest.approx(((6 + 6) / 2 + (2 + 6) / 2) / 2)
    assert float(rows["bleu"]["max"]) == pytest.approx(100.0) and float(rows["bleu"]["min"]) < 100
    assert rows["bertscore_f1"]["mean"].startswith("unavailable")
    assert "pip install bert-score" in capsys.readouterr().out


def test_tail_risk_from_a_score_column(tmp_path):
    scores = [float(s) for s in range(20)]
    path = _write(tmp_path / "scored.jsonl", [{"prediction": "x", "reference": "y", "score": s} for s in scores])
    assert main(["eval", "tail", "--predictions", str(path), "--resamples", "100", "--out", str(tmp_path)]) == 0
    with (tmp_path / "tail_risk.csv").open() as handle:
        rows = {row["statistic"]: row for row in csv.DictReader(handle)}
    assert float(rows["cvar@10"]["value (N=20)"]) == pytest.approx(cvar(scores, 0.1).item())  # (0 + 1) / 2
    assert float(rows["frac<50"]["value (N=20)"]) == pytest.approx(1.0)


def test_bad_prediction_file_names_the_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [{"prediction": "a", "reference": "b"}, {"pred": "a", "reference": "b"}])
    assert main(["eval", "metrics", "--predictions", str(path), "--out", str(tmp_path)]) == 2


def test_pairwise_command_with_a_tiny_judge(tmp_path, capsys):
    from test_evaluation_pairwise import _tiny_judge

    judge = tmp_path / "judge"
    _tiny_judge(judge)
    rows = [{"id": "a", "question": "what city", "reference": "berlin"},
            {"id": "b", "question": "which colour", "reference": "blue"}]
    x = _write(tmp_path / "x.jsonl", [{**row, "prediction": "berlin"} for row in rows])
    y = _write(tmp_path / "y.jsonl", [{**row, "prediction": "paris"} for row in reversed(rows)])
    out = tmp_path / "out"
    assert main(["eval", "pairwise", "--judge", str(judge), "--x", str(x), "--y", str(y), "--x-name", "LEAF",
                 "--y-name", "GRPO", "--max-new-tokens", "4", "--out", str(out)]) == 0
    outputs = [json.loads(line) for line in (out / "pairwise_outputs.jsonl").read_text().splitlines()]
    assert [o["id"] for o in outputs] == ["a", "b"]
    assert "win LEAF (%)" in (out / "pairwise.md").read_text()


def test_generate_samples_runs_that_metrics_then_scores(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(f"""\
output_dir: {tmp_path / 'no-run'}
backbone: {{name: tiny-qwen2-audio}}
task: {{name: spoken-translation, options: {{size: 8, validation_size: 1, test_size: 3, cache_dir: {tmp_path}}}}}
""")
    out = tmp_path / "predictions"
    assert main(["eval", "generate", str(run), "--split", "test", "--runs", "2", "--max-new-tokens", "5",
                 "--out", str(out)]) == 0
    files = sorted(out.glob("predictions-run*.jsonl"))
    assert [path.name for path in files] == ["predictions-run0.jsonl", "predictions-run1.jsonl"]
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert len(rows) == 3 and all(set(row) == {"id", "prediction", "reference", "question"} for row in rows)
    assert main(["eval", "metrics", "--predictions", *map(str, files), "--metrics", "bleu", "length",
                 "--out", str(tmp_path / "scores")]) == 0
    assert "| bleu |" in capsys.readouterr().out
