"""The speed table of ``leaf bench speed``: ratios from pytest-benchmark's JSON."""

from __future__ import annotations

import json

from leaf_plugins.bench.speed import SpeedRow, combine_runs, ratio_spread, read_speed_rows, speed_table


def _benchmark(estimator: str, size: str, median: float, fastest: float, tokens: int = 1000) -> dict:
    return {"extra_info": {"estimator": estimator, "size": size, "tokens": tokens},
            "stats": {"median": median, "min": fastest}}


def test_ratios_to_grpo_and_to_the_reference(tmp_path):
    report = tmp_path / "speed.json"
    report.write_text(json.dumps({"benchmarks": [
        _benchmark("grpo", "small", 0.002, 0.001),
        _benchmark("grpo (reference)", "small", 0.001, 0.001),
        _benchmark("leaf", "small", 0.008, 0.003),
        _benchmark("leaf (reference)", "small", 0.8, 0.8),
        _benchmark("grpo", "large", 0.010, 0.010),
        _benchmark("leaf", "large", 0.025, 0.020),
    ]}))
    rows = read_speed_rows(report)
    lines = speed_table(rows).splitlines()
    assert len(lines) == 2 + 4  # header, rule, two estimators at two sizes (no reference row)
    # grpo's own reference is twice as fast as grpo: a ratio below 10 keeps a decimal
    assert lines[2] == "| small | grpo | 2.00 | 1.00 | 500,000 | 1.0 | 1.0 | 0.5× |"
    # leaf at "small": 8 ms median = 4.0 x grpo's 2 ms, 3 ms fastest = 3.0 x grpo's 1 ms,
    # 1000 tokens / 0.008 s = 125,000 tokens/s, reference 0.8 s / 0.008 s = 100 x
    assert lines[3] == "| small | leaf | 8.00 | 3.00 | 125,000 | 4.0 | 3.0 | 100× |"
    assert lines[5] == "| large | leaf | 25.00 | 20.00 | 40,000 | 2.5 | 2.0 | – |"


def test_repeated_runs_combine_to_median_of_medians_and_fastest_round():
    runs = [
        [SpeedRow("s", "grpo", 2.0, 1.5, 10), SpeedRow("s", "leaf", 10.0, 8.0, 10)],
        [SpeedRow("s", "grpo", 1.0, 0.9, 10), SpeedRow("s", "leaf", 5.0, 4.5, 10)],
        [SpeedRow("s", "grpo", 4.0, 1.0, 10), SpeedRow("s", "leaf", 9.0, 6.0, 10)],
    ]
    combined = {row.estimator: row for row in combine_runs(runs)}
    assert (combined["grpo"].median_ms, combined["grpo"].min_ms) == (2.0, 0.9)
    assert (combined["leaf"].median_ms, combined["leaf"].min_ms) == (9.0, 4.5)
    # per run: 10/2, 5/1, 9/4
    assert ratio_spread(runs).splitlines()[2] == "| s | leaf | 5.0, 5.0, 2.2 |"
