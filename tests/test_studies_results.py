"""Study results from saved files: paired differences to a baseline variation with the
hierarchical bootstrap, the interquartile mean, too-few-seeds labelling, judges in studies,
and `leaf study --table` (a finished study on disk, built here without training)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU

from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.evaluation.grading import PROTOCOLS
from leaf_plugins.evaluation.judge_model import JudgeDecoding
from leaf_plugins.studies.config import JudgeSettings, load_study
from leaf_plugins.studies.evaluate import judge_decoding, judge_runs, task_kind
from leaf_plugins.studies.results import write_results
from leaf_plugins.studies.runner import _claim, run_study
from leaf_plugins.studies.statistics import hierarchical_bootstrap, interquartile_mean, mean_statistic
from written_files import run_naming_every_file_written

REFERENCES = ["the cat sat on the mat", "my sister lives in berlin", "the weather is cold today",
              "one two three four", "green blue yellow", "the answer is in the passage"]


def _corpus_bleu(predictions):
    return BLEU(lowercase=True).corpus_score(predictions, [REFERENCES]).score


def _predictions(variation: str, seed: int) -> list[str]:
    """Deterministic outputs: leaf drops fewer words than grpo; seeds drop different ones."""
    drop = 2 if variation == "leaf" else 1
    return [" ".join(w for k, w in enumerate(ref.split()) if (k + seed) % (drop + 2) != 0 or k == 0)
            for ref in REFERENCES]


def _da(variation: str, seed: int) -> list[float | None]:
    base = 70.0 if variation == "leaf" else 60.0
    scores = [base + seed + k for k in range(len(REFERENCES))]
    if variation == "grpo" and seed == 0:
        scores[2] = None  # no parsable judgment: left out of that seed's pairs
    return scores


def finished_study(tmp_path: Path, seeds: list[int], judges: str = "", reward: str = "sentence_bleu") -> Path:
    """A study file and, on disk, every run of it finished (predictions, evaluation.json,
    metrics.jsonl, DA per-item file): what `leaf study` leaves behind."""
    path = tmp_path / "study.yaml"
    path.write_text(f"""\
output_dir: {tmp_path / 'out'}
base: {{steps: 3, reward: {reward}, backbone: {{name: tiny-qwen2-audio}}, task: {{name: spoken-translation}}}}
grid: {{estimator.name: [grpo, leaf]}}
seeds: {seeds}
compare_to: estimator=grpo
evaluation: {{metrics: [bleu, length]{judges}}}
""")
    study = load_study(path)
    for run in study.runs:
        variation = run.config.estimator.name
        predictions = _predictions(variation, run.seed)
        _claim(run, study)  # the run directory's record of its settings, as the runner writes it
        with (run.directory / "predictions-run0.jsonl").open("w") as handle:
            for k, (prediction, reference) in enumerate(zip(predictions, REFERENCES)):
                handle.write(json.dumps({"id": f"i{k}", "prediction": prediction, "reference": reference,
                                         "question": "translate <|audio|>"}) + "\n")
        lengths = [len(p.split()) for p in predictions]
        (run.directory / "evaluation.json").write_text(json.dumps({
            "bleu": _corpus_bleu(predictions), "length": sum(lengths) / len(lengths), "train_reward_last": 0.5}))
        (run.directory / "metrics.jsonl").write_text("".join(json.dumps({"reward_mean": 0.1 * s}) + "\n"
                                                             for s in range(3)))
        rows = [f"i{k},{'' if s is None else s},{int(s is not None)},{int(s is None)}"
                for k, s in enumerate(_da(variation, run.seed))]
        (run.directory / "da_items.csv").write_text("id,score,parsed,unparsable\n" + "\n".join(rows) + "\n")
    return path


def test_two_seeds_give_paired_differences_over_items_only_and_say_why(tmp_path, capsys):
    path = finished_study(tmp_path, [0, 1])
    assert main(["study", str(path), "--table"]) == 0  # from the saved files: nothing trains
    table = (tmp_path / "out" / "results.md").read_text()
    assert table == capsys.readouterr().out.split("\nwritten:")[0].rstrip("\n") + "\n"
    assert "Not an interval: 2 seeds per variation are too few for a seed-level confidence interval" in table
    bleu = {v: [_corpus_bleu(_predictions(v, s)) for s in (0, 1)] for v in ("grpo", "leaf")}
    assert f"| estimator=leaf | 2 | {statistics.fmean(bleu['leaf']):.2f} ({min(bleu['leaf']):.2f}–" in table
    with (tmp_path / "out" / "results.csv").open() as handle:
        rows = {row["variation"]: row for row in csv.DictReader(handle)}
    leaf = rows["estimator=leaf"]
    expected_bleu = statistics.fmean(bleu["leaf"][s] - bleu["grpo"][s] for s in (0, 1))
    assert float(leaf["delta_bleu"]) == pytest.approx(expected_bleu)
    # DA: per seed the mean paired difference over items both runs scored, then the mean over seeds
    seed0 = statistics.fmean(a - b for a, b in zip(_da("leaf", 0), _da("grpo", 0)) if b is not None)
    seed1 = statistics.fmean(a - b for a, b in zip(_da("leaf", 1), _da("grpo", 1)))
    assert float(leaf["delta_da"]) == pytest.approx((seed0 + seed1) / 2) == pytest.approx(10.0)
    assert float(leaf["delta_da_low"]) == float(leaf["delta_da_high"]) == pytest.approx(10.0)  # constant differences
    assert leaf["delta_bleu_seed_level"] == "False" and rows["estimator=grpo"]["delta_bleu"] == ""
    assert float(leaf["delta_bleu_low"]) <= float(leaf["delta_bleu"]) <= float(leaf["delta_bleu_high"])
    assert "items only: 2 seeds too few for a seed-level interval (>= 5)" in table
    assert "Paired difference vs estimator=grpo (same seeds, same items)" in table
    assert "| estimator=leaf | estimator=grpo | 2 |" in table and "IQM over seeds (rliable) not shown" in table
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 0


def test_the_written_line_names_every_file_the_study_wrote(tmp_path, capsys):
    path = finished_study(tmp_path, [0])
    output = tmp_path / "out"
    printed = run_naming_every_file_written(["study", str(path), "--table"], output, capsys)
    assert "results_runs.csv" in printed and "learning_curves.png" in printed
    printed = run_naming_every_file_written(["study", str(path)], output, capsys)  # every run finished: no training
    assert "results_runs.csv" in printed and "study.resolved.yaml" in printed


def test_one_seed_is_named_in_the_singular(tmp_path):
    path = finished_study(tmp_path, [0])
    assert main(["study", str(path), "--table"]) == 0
    table = (tmp_path / "out" / "results.md").read_text()
    assert "Not an interval: 1 seed per variation is too few for a seed-level confidence interval" in table
    assert "1 seeds" not in table and "1 seed per variation are" not in table


def test_five_seeds_give_seed_level_intervals_and_the_iqm(tmp_path):
    seeds = [0, 1, 2, 3, 4]
    study = load_study(finished_study(tmp_path, seeds))
    table = write_results(study)[0].read_text()
    assert "Mean over seeds [percentile bootstrap 95% CI over seeds]." in table
    assert "| seeds and items |" in table and "items only" not in table
    with (tmp_path / "out" / "results.csv").open() as handle:
        leaf = {row["variation"]: row for row in csv.DictReader(handle)}["estimator=leaf"]
    values = sorted(_corpus_bleu(_predictions("leaf", s)) for s in seeds)
    assert float(leaf["bleu_iqm"]) == pytest.approx(statistics.fmean(values[1:4]))  # trims one seed at each end
    assert f"| {float(leaf['bleu_iqm']):.2f} |" in table
    assert float(leaf["bleu"]) == pytest.approx(statistics.fmean(values))
    # a percentile bootstrap over seeds resamples the 5 seed values: every resampled mean, so
    # both ends of the interval, lies between the lowest and the highest seed
    assert values[0] <= float(leaf["bleu_low"]) <= float(leaf["bleu"]) <= float(leaf["bleu_high"]) <= values[-1]
    differences = [_corpus_bleu(_predictions("leaf", s)) - _corpus_bleu(_predictions("grpo", s)) for s in seeds]
    assert float(leaf["delta_bleu"]) == pytest.approx(statistics.fmean(differences))
    assert leaf["delta_bleu_seed_level"] == "True"


def test_hierarchical_bootstrap_levels():
    items = [torch.full((50,), float(value)) for value in (0.0, 0.0, 0.0, 0.0, 10.0)]  # constant within seeds
    stats = [mean_statistic(values) for values in items]
    seeds_fixed = hierarchical_bootstrap(stats, [50] * 5, min_seeds=6)
    assert (seeds_fixed.value, seeds_fixed.low, seeds_fixed.high, seeds_fixed.seed_level) == (2.0, 2.0, 2.0, False)
    seeds_drawn = hierarchical_bootstrap(stats, [50] * 5, resamples=2000)
    assert seeds_drawn.seed_level and seeds_drawn.low == 0.0 and seeds_drawn.high >= 6.0  # 0 to 3 draws of seed 5
    # one seed, items resampled: the percentile interval of a mean is close to mean ± 1.96 sd / sqrt(n)
    values = torch.randn(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    interval = hierarchical_bootstrap([mean_statistic(values)], [400], resamples=4000)
    half = 1.96 * float(values.std()) / math.sqrt(400)
    assert interval.value == pytest.approx(float(values.mean()))
    assert interval.low == pytest.approx(interval.value - half, abs=0.02)
    assert interval.high == pytest.approx(interval.value + half, abs=0.02)
    with pytest.raises(ValueError, match="one item count per seed"):
        hierarchical_bootstrap(stats, [50])


def test_interquartile_mean_is_rliables():
    assert interquartile_mean([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert interquartile_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0
    assert math.isnan(interquartile_mean([1.0, 2.0, 3.0]))
    values = [0.3, 5.0, 2.2, 9.1, 4.4, 7.7, 1.0, 6.5, 3.3]  # sorted, the middle 5: 2.2 3.3 4.4 5.0 6.5
    assert interquartile_mean(values) == pytest.approx((2.2 + 3.3 + 4.4 + 5.0 + 6.5) / 5)  # scipy's trim_mean(·, .25)


def test_study_file_checks_compare_to_and_judges(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""\
base: {steps: 3}
grid: {estimator.name: [grpo, leaf]}
compare_to: estimator=grp
evaluation:
  judges:
    da: {model: some/judge, task: translaton, dtype: bf16}
    likret: {model: x}
""")
    with pytest.raises(ConfigError) as caught:
        load_study(path)
    message = str(caught.value)
    for line in (f"{path}:3:1: compare_to: 'estimator=grp' is neither a variation nor a setting of one. Did you mean "
                 "'estimator=grpo'",
                 f"{path}:6:29: evaluation.judges.da.task: unknown value 'translaton'. Did you mean 'translation'?",
                 f"{path}:6:47: evaluation.judges.da.dtype: unknown value 'bf16'",
                 f"{path}:7:5: unknown key 'evaluation.judges.likret'. Did you mean 'likert'?"):
        assert line in message, (line, message)
    assert (task_kind("auto", "covost2-en-de"), task_kind("auto", "spoken-qa"), task_kind("qa", "covost2-en-de")) == (
        "translation", "qa", "qa")
    settings = JudgeSettings(model="some/judge", max_new_tokens=4, batch_size=2, seed=3, chat_template=False)
    assert judge_decoding(settings, PROTOCOLS["da"].decoding) == JudgeDecoding(  # None keeps the protocol's
        samples=5, temperature=0.7, max_new_tokens=4, batch_size=2, seed=3, chat_template=False)


def test_compare_to_a_grid_setting_pairs_each_variation_with_its_own_baseline(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("""\
base: {steps: 3}
grid: {estimator.name: [grpo, leaf], optim.learning_rate: [0.1, 0.2]}
compare_to: estimator=grpo
""")
    study = load_study(path)
    assert study.baseline_of("estimator=leaf, learning_rate=0.2") == "estimator=grpo, learning_rate=0.2"
    assert study.baseline_of("estimator=grpo, learning_rate=0.1") == "estimator=grpo, learning_rate=0.1"
    labelled = load_study(path, ["compare_to=estimator=grpo, learning_rate=0.1"])
    assert labelled.baseline_of("estimator=leaf, learning_rate=0.2") == "estimator=grpo, learning_rate=0.1"
    assert load_study(path, ["compare_to=null"]).baseline_of("estimator=leaf, learning_rate=0.2") == (
        "estimator=grpo, learning_rate=0.1")  # default: the first variation


def test_judges_score_finished_runs_once_and_enter_the_table(tmp_path):
    from test_evaluation_pairwise import _tiny_judge

    judge = tmp_path / "judge"
    _tiny_judge(judge)
    path = finished_study(tmp_path, [0])  # finished without judges
    study = load_study(path, [f"evaluation.judges.likert.model={judge}", "evaluation.judges.likert.max_new_tokens=4"])
    table = run_study(study)[0].read_text()  # judges added later: they score the finished runs, nothing retrains
    files = [run.directory / "likert_items.csv" for run in study.runs]
    assert all(path.exists() for path in files)
    assert all(not (run.directory / "da_outputs.jsonl").exists() for run in study.runs)  # DA has no model: off
    assert "ΔLikert 1-5" in table and "ΔDA 0-100" in table
    stamps = [path.stat().st_mtime_ns for path in files]
    judge_runs([(run.directory, run.config.task.name) for run in study.runs], study.config.evaluation.judges)
    assert [path.stat().st_mtime_ns for path in files] == stamps  # already judged: skipped


def test_studies_trained_on_exact_match_report_its_paired_held_out_difference(tmp_path):
    """A study whose runs train on ``exact_match`` gets a paired held-out exact-match
    column: the mean over seeds of (leaf's − grpo's) share of predictions equal to their
    reference, in percent, counted here directly; other studies do not."""
    (tmp_path / "exact").mkdir()
    (tmp_path / "bleu").mkdir()
    study = load_study(finished_study(tmp_path / "exact", [0, 1, 2, 3, 4], reward="exact_match"))
    table = write_results(study)[0].read_text()
    header = next(line for line in table.splitlines() if line.startswith("| variation | baseline"))
    assert "Δexact match (%)" in header
    row = next(line for line in table.splitlines() if line.startswith("| estimator=leaf | estimator=grpo"))
    column = header.split(" | ").index("Δexact match (%)")

    def matches(variation, seed):
        return 100 * sum(p == r for p, r in zip(_predictions(variation, seed), REFERENCES)) / len(REFERENCES)

    expected = statistics.mean(matches("leaf", seed) - matches("grpo", seed) for seed in range(5))
    assert expected != 0  # the fixture's variations differ in exact matches
    assert row.split(" | ")[column].startswith(f"{expected:+.2f} [")
    other = write_results(load_study(finished_study(tmp_path / "bleu", [0, 1])))[0].read_text()
    assert "exact match" not in other
