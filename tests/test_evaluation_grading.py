"""Absolute judges: parsing of every output format, the prompts, a forced (fake) judge that
prints known scores, the commands end to end with a random-weight judge, tail on the
per-item file and the master-table report."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch
from transformers import LogitsProcessor

from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.evaluation.grading import PROTOCOLS, grade, read_item_scores, write_grades
from leaf_plugins.evaluation.grading_parse import AMBIGUOUS, NO_SCORE, NOT_INTEGER, OUT_OF_RANGE, parse_da, parse_likert
from leaf_plugins.evaluation.grading_prompts import (LIKERT_SYSTEM, RUBRICS, GradeItem, clean_question, da_prompt,
                                                     likert_prompt)
from leaf_plugins.evaluation.judge_model import JudgeDecoding, load_judge
from leaf_plugins.evaluation.tail_risk import cvar
from test_evaluation_pairwise import _tiny_judge
from written_files import run_naming_every_file_written


@pytest.mark.parametrize("text, score, problem", [
    ("85", 85.0, None),
    (" 72.5\n", 72.5, None),
    ("Score: 90", 90.0, None),
    ("**Score:** 64 - good meaning, small grammar slips", 64.0, None),
    ("I would give it a score of 40.", 40.0, None),
    ("80/100", 80.0, None),
    ("70 out of 100", 70.0, None),
    ("Score: 55\nThe translation keeps 3 of 4 facts, score: 55", 55.0, None),  # labelled numbers agree
    ("0", 0.0, None),
    ("100", 100.0, None),
    ("", None, NO_SCORE),
    ("the answer is good", None, NO_SCORE),
    ("150", None, OUT_OF_RANGE),
    ("-5", None, OUT_OF_RANGE),
    ("100.5", None, OUT_OF_RANGE),
    ("70 or 60", None, AMBIGUOUS),
    ("Score: 85 ... on reflection Score: 75", None, AMBIGUOUS),
])
def test_parse_da(text, score, problem):
    parsed = parse_da(text)
    assert (parsed.score, parsed.problem) == (score, problem)
    assert parsed.ok == (score is not None)


@pytest.mark.parametrize("text, score, problem", [
    ("The response is correct and grounded. [RESULT] 4", 4.0, None),
    ("Feedback: fine [RESULT] (5)", 5.0, None),
    ("... [RESULT]: 3", 3.0, None),
    ("... [result] 2/5", 2.0, None),
    ("... [RESULT] 1 out of 5", 1.0, None),
    ("first [RESULT] 2, revised: [RESULT] 5", 5.0, None),  # the last marker counts
    ("Score: 4", None, NO_SCORE),
    ("4", None, NO_SCORE),
    ("[RESULT] five", None, NO_SCORE),
    ("", None, NO_SCORE),
    ("[RESULT] 0", None, OUT_OF_RANGE),
    ("[RESULT] 7", None, OUT_OF_RANGE),
    ("[RESULT] 3.5", None, NOT_INTEGER),
])
def test_parse_likert(text, score, problem):
    parsed = parse_likert(text)
    assert (parsed.score, parsed.problem) == (score, problem)


def test_prompts_hold_the_item_and_follow_the_protocols():
    item = GradeItem("q1", "Listen to the audio <|audio|> and answer: where does she live?", "in berlin",
                     "she lives in berlin")
    assert clean_question(item.question) == "Listen to the audio [audio] and answer: where does she live?"
    assert clean_question("<|audio_bos|><|AUDIO|><|audio_eos|>\nwho speaks") == "[audio]\nwho speaks"
    qa = da_prompt(item)
    assert qa.endswith('Question: "Listen to the audio [audio] and answer: where does she live?"\n'
                       'Reference answer: in berlin\nAnswer: "she lives in berlin"\nScore: ')
    assert "continuous scale from 0 to 100" in qa
    translation = da_prompt(GradeItem("t", "Translate <|audio|>", "Hallo Welt", "Hallo Erde"), "translation")
    assert translation.startswith("Score the following translation from English to German with respect to the "
                                  "human reference")
    assert translation.endswith('German human reference: Hallo Welt\nGerman translation: "Hallo Erde"\nScore: ')
    assert "source:" not in translation  # speech: no source text
    with_source = da_prompt(GradeItem("t", "", "Hallo Welt", "Hallo Erde", source="Hello world"), "translation")
    assert '\n\nEnglish source: "Hello world"\nGerman human reference: Hallo Welt\n' in with_source
    likert = likert_prompt(item)
    assert "###Response to evaluate:\nshe lives in berlin\n\n###Reference Answer (Score 5):\nin berlin\n" in likert
    assert f"###Score Rubrics:\n{RUBRICS['qa']}\n\n###Feedback: " in likert
    assert RUBRICS["translation"] in likert_prompt(item, "translation")
    assert "[RESULT] (an integer number between 1 and 5)" in likert
    with pytest.raises(ConfigError, match="Did you mean 'translation'"):
        da_prompt(item, "translaton")


class ForceOutputs(LogitsProcessor):
    """Forces a real causal LM to print known texts: the k-th sampled row of a prompt
    prints ``scripts[prompt][k]`` and then EOS, whatever the weights say."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], chat_formatted: bool) -> None:
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        encode = lambda text, special: tuple(tokenizer(text, add_special_tokens=special).input_ids)  # noqa: E731
        self.targets = {encode(prompt, not chat_formatted): [list(encode(text, False)) + [self.eos] for text in texts]
                        for prompt, texts in scripts.items()}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(scores, float("-inf"))  # [rows, V]
        seen: Counter = Counter()
        for row, ids in enumerate(input_ids.tolist()):
            ids = ids[next(i for i, token in enumerate(ids) if token != self.pad):]  # left padding off
            prompt = next(p for p in self.targets if tuple(ids[: len(p)]) == p)
            target = self.targets[prompt][seen[prompt]]
            seen[prompt] += 1
            step = len(ids) - len(prompt)
            forced[row, target[step] if step < len(target) else self.eos] = 0.0
        return forced


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("judge")
    _tiny_judge(directory)
    return directory


ITEMS = [GradeItem("a", "what city <|audio|>", "berlin", "berlin"),
         GradeItem("b", "which colour <|audio|>", "blue", "green"),
         GradeItem("c", "how many <|audio|>", "three", "three four")]
DA_SCRIPTS = {
    "a": ["85", "Score: 90", "80/100", "great"],  # 85, 90, 80, no score -> 85
    "b": ["150", "-3", "70 or 60", ""],  # out of range x2, ambiguous, no score -> no item score
    "c": ["Score: 42.5", "42.5", "**Score:** 50", "a score of 45"],  # -> 45
}


def test_a_forced_judge_gives_exact_means_counts_and_csv(judge_dir, tmp_path, capsys):
    judge = load_judge(str(judge_dir))
    assert judge.has_chat_template  # the chat path is the one exercised
    texts = {item.id: judge.format(da_prompt(item)) for item in ITEMS}
    force = ForceOutputs(judge.tokenizer, {texts[i]: script for i, script in DA_SCRIPTS.items()}, chat_formatted=True)
    decoding = replace(PROTOCOLS["da"].decoding, samples=4, batch_size=2, max_new_tokens=12, logits_processor=[force])
    grades = grade(judge, ITEMS, "da", decoding)
    assert grades.outputs == [DA_SCRIPTS["a"], DA_SCRIPTS["b"], DA_SCRIPTS["c"]]
    assert grades.item_scores == [85.0, None, 45.0]
    assert grades.counts == {"judgments": 12, "parsed": 7, "unparsable": 5, NO_SCORE: 2, OUT_OF_RANGE: 2,
                             AMBIGUOUS: 1, NOT_INTEGER: 0, "items_without_score": 1}
    assert write_grades(grades, tmp_path)[-1].stat().st_size > 0  # da_scores.png
    assert (tmp_path / "da_items.csv").read_text().splitlines() == [
        "id,score,parsed,unparsable,judgment_1,judgment_2,judgment_3,judgment_4,problems",
        "a,85,3,1,85,90,80,,4: no score",
        "b,,0,4,,,,,1: out of range; 2: out of range; 3: ambiguous; 4: no score",
        "c,45,4,0,42.5,42.5,50,45,",
    ]
    assert read_item_scores(tmp_path / "da_items.csv") == (["a", "b", "c"], [85.0, None, 45.0])
    raw = [json.loads(line) for line in (tmp_path / "da_outputs.jsonl").read_text().splitlines()]
    assert raw[1]["outputs"] == DA_SCRIPTS["b"] and raw[1]["scores"] == [None] * 4
    assert raw[0]["prompt"] == da_prompt(ITEMS[0])
    with (tmp_path / "da.csv").open() as handle:
        summary = dict(csv.reader(handle))
    assert summary["unparsable"] == "5 (41.7%)" and summary["items without a parsable judgment"] == "1"
    assert summary["mean item score [95% CI] (N=2)"].startswith("65.00 [")

    # tail analysis straight from the per-item file: the item without a score is left out, and said so
    out = tmp_path / "tail"
    run_naming_every_file_written(["eval", "tail", "--scores", str(tmp_path / "da_items.csv"), "--resamples", "50",
                                   "--out", str(out)], out, capsys)
    with (out / "tail_risk.csv").open() as handle:
        rows = {row["statistic"]: row for row in csv.DictReader(handle)}
    assert float(rows["mean"]["value (N=2)"]) == 65.0
    assert float(rows["cvar@25"]["value (N=2)"]) == pytest.approx(cvar([85.0, 45.0], 0.25).item())


def test_likert_is_greedy_with_the_system_turn_and_sampling_needs_a_temperature(judge_dir):
    judge = load_judge(str(judge_dir))
    texts = {item.id: judge.format(likert_prompt(item), LIKERT_SYSTEM) for item in ITEMS}
    assert texts["a"].startswith(f"<|im_start|>system\n{LIKERT_SYSTEM}<|im_end|>\n<|im_start|>user\n###Task")
    scripts = {texts["a"]: ["Correct. [RESULT] 4"], texts["b"]: ["Wrong colour. [RESULT] 7"],
               texts["c"]: ["Partly. [RESULT] 3"]}
    force = ForceOutputs(judge.tokenizer, scripts, chat_formatted=True)
    grades = grade(judge, ITEMS, "likert", replace(PROTOCOLS["likert"].decoding, max_new_tokens=32,
                                                   logits_processor=[force]))
    assert (grades.samples, grades.temperature) == (1, 0.0)
    assert grades.item_scores == [4.0, None, 3.0] and grades.counts[OUT_OF_RANGE] == 1
    with pytest.raises(ConfigError, match="temperature 0 is greedy"):
        replace(PROTOCOLS["likert"].decoding, samples=3)
    with pytest.raises(ConfigError, match="max_new_tokens must be >= 1"):
        JudgeDecoding(max_new_tokens=0)
    with pytest.raises(ConfigError, match="Did you mean 'likert'"):
        grade(judge, ITEMS, "likret")


def test_da_command_with_a_random_judge_counts_what_does_not_parse(judge_dir, tmp_path, capsys):
    rows = [{"id": f"q{k}", "question": "what city <|audio|>", "reference": "berlin", "prediction": text}
            for k, text in enumerate(["berlin", "paris", "the city", "bonn"])]
    run = tmp_path / "run"
    run.mkdir()
    predictions = run / "predictions-run0.jsonl"
    predictions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    printed = run_naming_every_file_written(["eval", "da", "--judge", str(judge_dir), "--predictions", str(predictions),
                                             "--samples", "3", "--limit", "3", "--max-new-tokens", "6", "--batch-size",
                                             "2", "--out", str(run)], run, capsys)
    raw = [json.loads(line) for line in (run / "da_outputs.jsonl").read_text().splitlines()]
    assert [r["id"] for r in raw] == ["q0", "q1", "q2"] and all(len(r["outputs"]) == 3 for r in raw)
    parsed = [[parse_da(text) for text in r["outputs"]] for r in raw]  # recomputed from the raw outputs
    failed = sum(not p.ok for judgments in parsed for p in judgments)
    assert failed > 0  # random weights: most outputs hold no score
    with (run / "da_items.csv").open() as handle:
        items = list(csv.DictReader(handle))
    assert [int(row["unparsable"]) for row in items] == [sum(not p.ok for p in j) for j in parsed]
    for row, judgments in zip(items, parsed):
        scores = [p.score for p in judgments if p.ok]
        assert row["score"] == (f"{sum(scores) / len(scores):g}" if scores else "")
    assert f"unparsable: {failed} ({100 * failed / 9:.1f}%)" in printed

    # the master table: DA from the file, the rest unavailable with the commands that fill them
    run_naming_every_file_written(["eval", "report", str(run), "--names", "tiny", "--out", str(tmp_path / "report")],
                                  tmp_path / "report", capsys)
    report = (tmp_path / "report" / "report.md").read_text()
    assert report.splitlines()[0] == ("| run | BLEU | R-1 | R-2 | R-L | METEOR | BS-F1 | Pred tok | Likert 1-5 | "
                                      "DA 0-100 |")
    assert report.splitlines()[2].startswith("| tiny | unavailable |")
    assert f"leaf eval metrics --predictions {predictions} --out {run}" in report
    assert f"leaf eval likert --judge MODEL --predictions {predictions} --out {run}" in report
    assert f"{failed} of 9 judgments unparsable" in report


def test_report_reads_metrics_and_judge_files(tmp_path):
    run = tmp_path / "leaf"
    run.mkdir()
    (run / "metrics.csv").write_text(
        "metric,mean,std over runs,min,max,runs\nbleu,45.82,0,45.82,45.82,1\nrouge1,68.84,0,0,0,1\n"
        "rouge2,54.19,0,0,0,1\nrougeL,65.60,0,0,0,1\nmeteor,68.53,0,0,0,1\n"
        "bertscore_f1,unavailable (package bert-score is not installed; install: pip install bert-score),,,,1\n"
        "length,18.5,0,0,0,1\n")
    (run / "da_items.csv").write_text("id,score,parsed,unparsable,judgment_1,problems\na,80,1,0,80,\nb,90,1,0,90,\n"
                                      "c,,0,1,,1: no score\n")
    (run / "likert_items.csv").write_text("id,score,parsed,unparsable,judgment_1,problems\na,3,1,0,3,\nb,3,1,0,3,\n")
    assert main(["eval", "report", str(run), "--names", "LEAF", "--out", str(tmp_path)]) == 0
    line = (tmp_path / "report.md").read_text().splitlines()[2]
    assert line.startswith("| LEAF | 45.82 | 68.84 | 54.19 | 65.60 | 68.53 | unavailable | 18.5 | 3.00 [3.00, 3.00] | "
                           "85.00 [")
    text = (tmp_path / "report.md").read_text()
    assert "pip install bert-score" in text and "1 of 3 judgments unparsable, 1 without a parsable judgment" in text
    with (tmp_path / "report.csv").open() as handle:
        row = next(csv.DictReader(handle))
    assert (row["bleu"], row["bertscore_f1"], row["likert"], row["da"]) == ("45.82", "unavailable", "3.0", "85.0")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "da_items.csv").write_text("id,score,parsed,unparsable\na,high,1,0\n")
    assert main(["eval", "report", str(bad), "--out", str(tmp_path)]) == 2


def test_the_docs_show_the_exact_prompts():
    from pathlib import Path

    from leaf_plugins.evaluation.grading_prompts import DA_QA, DA_TRANSLATION, LIKERT_PROMPT

    docs = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    for text in (DA_QA, DA_TRANSLATION, LIKERT_SYSTEM, LIKERT_PROMPT, RUBRICS["qa"], RUBRICS["translation"]):
        assert f"```text\n{text}\n```" in docs, text[:60]


def test_chat_formatting_with_and_without_a_template():
    from leaf_plugins.backbones.tokenizer import train_tokenizer
    from leaf_plugins.evaluation.judge_model import JudgeModel

    tokenizer = train_tokenizer(["<eos>", "<pad>"], eos_token="<eos>", pad_token="<pad>", vocab_size=300)
    judge = JudgeModel("j", torch.nn.Identity(), tokenizer, torch.device("cpu"))
    assert judge.format("P", "S") == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nP<|im_end|>\n"
                                      "<|im_start|>assistant\n")
    assert judge.format("P", "S", chat=False) == "S\n\nP"
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
                               "{% endif %}<u>{{ m['content'] }}</u>{% endfor %}")
    assert judge.format("P", "S") == "<u>S\n\nP</u>"  # a template refusing a system turn gets it on top
    tokenizer.chat_template = None
    assert not judge.has_chat_template and judge.format("P") == "P"


def test_bad_decoding_is_refused_before_the_judge_is_loaded(tmp_path, capsys):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"prediction": "a", "reference": "b"}) + "\n")
    missing = str(tmp_path / "no-judge")
    assert main(["eval", "likert", "--judge", missing, "--predictions", str(predictions), "--samples", "3"]) == 2
    assert "temperature 0 is greedy decoding: 3 samples would be identical" in capsys.readouterr().err
    assert main(["eval", "da", "--judge", missing, "--predictions", str(predictions), "--limit", "0"]) == 2
    assert main(["eval", "da", "--judge", missing, "--predictions", str(predictions)]) == 2
    assert "could not be loaded" in capsys.readouterr().err
