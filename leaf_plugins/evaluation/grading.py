"""Absolute grading of prediction files by an LLM judge: GEMBA-DA 0–100 and Likert 1–5.

``grade`` builds each item's prompt (``grading_prompts``), asks the judge for N samples
per item (``JudgeModel.generate`` with the protocol's ``JudgeDecoding`` or the caller's:
chat template when the model has one, batches, a progress bar), parses every output
(``grading_parse``) and keeps all of it: the raw outputs, each parsed score or the reason
it did not parse, and per item the mean of the parsed scores (None when none parsed). Nothing unparsable is dropped silently or read as 0:
``Grades.counts`` says how many outputs failed and why.

``write_grades`` writes ``<protocol>_items.csv`` (one row per item: the score, how many
judgments parsed and each judgment), ``<protocol>_outputs.jsonl`` (every raw output) and
``<protocol>.md``/``.csv`` (the run's summary) and ``<protocol>_scores.png`` (a histogram
of the item scores). ``read_item_scores`` reads the per-item
file back (``leaf eval tail``, ``leaf eval report`` and studies do).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.evaluation.grading_parse import PROBLEMS, Parsed, parse_da, parse_likert
from leaf_plugins.evaluation.grading_prompts import LIKERT_SYSTEM, GradeItem, da_prompt, likert_prompt
from leaf_plugins.evaluation.judge_model import JudgeDecoding, JudgeModel
from leaf_plugins.evaluation.predictions import PredictionFile
from leaf_plugins.evaluation.tail_risk import Estimate, bootstrap, mean

__all__ = ["Protocol", "PROTOCOLS", "Grades", "grade", "write_grades", "read_item_scores", "items_file",
           "protocol", "summary_rows", "score_estimate", "grade_items"]


@dataclass(frozen=True)
class Protocol:
    """One absolute judge protocol: its scale, its default decoding (the paper's) and its parser."""

    name: str
    title: str
    low: float
    high: float
    decoding: JudgeDecoding
    parse: Callable[[str], Parsed]
    system: str | None


PROTOCOLS = {
    "da": Protocol("da", "GEMBA-DA 0-100", 0.0, 100.0, JudgeDecoding(samples=5, temperature=0.7, max_new_tokens=16),
                   parse=parse_da, system=None),
    "likert": Protocol("likert", "Likert 1-5", 1.0, 5.0, JudgeDecoding(samples=1, temperature=0.0, max_new_tokens=384),
                       parse=parse_likert, system=LIKERT_SYSTEM),
}
"""``da``: N = 5 samples at T = 0.7 (paper); a score needs few tokens. ``likert``: greedy
(paper), room for Prometheus' feedback before ``[RESULT] n``. Both send the prompt in the
judge's chat template when it has one."""


def protocol(name: str) -> Protocol:
    """The protocol called ``name`` (``da`` or ``likert``), with a did-you-mean."""
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown judge protocol {name!r}.{suggest(name, PROTOCOLS)} "
                          f"Protocols: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def items_file(name: str) -> str:
    """The per-item file name of protocol ``name`` in an output directory."""
    return f"{name}_items.csv"


def grade_items(predictions: PredictionFile) -> list[GradeItem]:
    """The items of a prediction file, ready to grade (question, reference, prediction)."""
    return [GradeItem(*fields) for fields in zip(predictions.ids, predictions.questions, predictions.references,
                                                 predictions.predictions)]


@dataclass(frozen=True)
class Grades:
    """Every judgment of one graded run: ``outputs[i][s]`` is sample s of item i and
    ``parsed[i][s]`` its score or the reason it did not parse."""

    protocol: Protocol
    judge: str
    items: list[GradeItem]
    prompts: list[str]
    outputs: list[list[str]]
    parsed: list[list[Parsed]]
    temperature: float

    @property
    def samples(self) -> int:
        return len(self.outputs[0]) if self.outputs else 0

    @property
    def item_scores(self) -> list[float | None]:
        """Per item, the mean of its parsed judgments (None when none parsed)."""
        out = []
        for judgments in self.parsed:
            scores = [p.score for p in judgments if p.ok]
            out.append(sum(scores) / len(scores) if scores else None)
        return out

    @property
    def counts(self) -> dict[str, int]:
        """``judgments``, ``parsed``, ``unparsable``, one count per reason, and
        ``items_without_score`` (items none of whose judgments parsed)."""
        flat = [p for judgments in self.parsed for p in judgments]
        out = {"judgments": len(flat), "parsed": sum(p.ok for p in flat), "unparsable": sum(not p.ok for p in flat)}
        out.update({problem: sum(p.problem == problem for p in flat) for problem in PROBLEMS})
        out["items_without_score"] = sum(score is None for score in self.item_scores)
        return out


def grade(
    judge: JudgeModel,
    items: Sequence[GradeItem],
    protocol_name: str,
    decoding: JudgeDecoding | None = None,
    kind: str = "qa",
    rubric: str | None = None,
    source_lang: str = "English",
    target_lang: str = "German",
) -> Grades:
    """Grade ``items`` with ``judge`` under protocol ``da`` or ``likert``.

    :param decoding: samples, temperature, batches, seed, chat template, logits processors
        (default: the protocol's, ``PROTOCOLS[name].decoding``: DA 5 samples at 0.7, Likert
        one greedy judgment; ``dataclasses.replace`` it to change a few settings).
    :param kind: ``qa`` or ``translation``: the DA prompt's wording, the Likert rubric.
    """
    chosen = protocol(protocol_name)
    if not items:
        raise ValueError("no items to grade")
    decoding = chosen.decoding if decoding is None else decoding
    if chosen.name == "da":
        prompts = [da_prompt(item, kind, source_lang, target_lang) for item in items]
    else:
        prompts = [likert_prompt(item, kind, rubric) for item in items]
    outputs = judge.generate(prompts, decoding, chosen.system, description=f"{chosen.title} judge")
    parsed = [[chosen.parse(text) for text in texts_of_item] for texts_of_item in outputs]
    return Grades(chosen, judge.name, list(items), prompts, outputs, parsed, decoding.temperature)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def summary_rows(grades: Grades, resamples: int = 1000, seed: int = 0) -> list[tuple[str, str]]:
    """(statistic, value) rows of one graded run: the judge and settings, the counts of
    parsed and unparsable judgments (by reason), and the mean item score with its item
    bootstrap 95% CI (over the items that have a score)."""
    counts = grades.counts
    share = 100.0 * counts["unparsable"] / counts["judgments"]
    rows = [("judge", grades.judge), ("protocol", grades.protocol.title), ("items", str(len(grades.items))),
            ("samples per item", str(grades.samples)), ("temperature", f"{grades.temperature:g}"),
            ("judgments", str(counts["judgments"])), ("parsed", str(counts["parsed"])),
            ("unparsable", f"{counts['unparsable']} ({share:.1f}%)")]
    rows += [(f"unparsable: {problem}", str(counts[problem])) for problem in PROBLEMS if counts[problem]]
    rows.append(("items without a parsable judgment", str(counts["items_without_score"])))
    estimate = score_estimate(grades.item_scores, resamples, seed)
    if estimate is not None:
        scored = len(grades.items) - counts["items_without_score"]
        rows.append((f"mean item score [95% CI] (N={scored})", str(estimate)))
    else:
        rows.append(("mean item score", "unavailable: no judgment parsed"))
    return rows


def write_grades(grades: Grades, out_dir: str | Path) -> list[Path]:
    """Write the per-item CSV, the raw outputs (JSONL) and the summary (Markdown, CSV)
    of ``grades`` into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = grades.protocol.name
    items_path = out_dir / items_file(name)
    with items_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "score", "parsed", "unparsable", *(f"judgment_{s + 1}" for s in range(grades.samples)),
                         "problems"])
        for item, score, judgments in zip(grades.items, grades.item_scores, grades.parsed):
            problems = "; ".join(f"{s + 1}: {p.problem}" for s, p in enumerate(judgments) if not p.ok)
            writer.writerow([item.id, _number(score), sum(p.ok for p in judgments), sum(not p.ok for p in judgments),
                             *(_number(p.score) for p in judgments), problems])
    outputs_path = out_dir / f"{name}_outputs.jsonl"
    with outputs_path.open("w") as handle:
        for item, prompt, texts, judgments in zip(grades.items, grades.prompts, grades.outputs, grades.parsed):
            handle.write(json.dumps({"id": item.id, "prompt": prompt, "outputs": texts,
                                     "scores": [p.score for p in judgments],
                                     "problems": [p.problem for p in judgments]}, ensure_ascii=False) + "\n")
    rows = summary_rows(grades)
    with (out_dir / f"{name}.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([("statistic", "value"), *rows])
    table = ["| statistic | value |", "|---|---|", *(f"| {label} | {value} |" for label, value in rows)]
    (out_dir / f"{name}.md").write_text("\n".join(table) + "\n")
    plot = _plot_scores(grades, out_dir / f"{name}_scores.png")
    return [items_path, outputs_path, out_dir / f"{name}.md", out_dir / f"{name}.csv", plot]


def _plot_scores(grades: Grades, path: Path) -> Path:
    """Histogram of the item scores over the protocol's scale; the title counts what did not parse."""
    from leaf_plugins.analysis.plots import pyplot

    plt = pyplot()
    chosen, counts = grades.protocol, grades.counts
    scores = [score for score in grades.item_scores if score is not None]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.hist(scores, bins=20, range=(chosen.low, chosen.high), color="tab:blue")
    axis.set_xlabel(f"item score (mean of parsed judgments), {chosen.title}")
    axis.set_ylabel("items")
    axis.set_title(f"{Path(grades.judge).name}: {len(scores)} of {len(grades.items)} items scored; "
                   f"{counts['unparsable']} of {counts['judgments']} judgments unparsable", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def read_item_scores(path: str | Path) -> tuple[list[str], list[float | None]]:
    """Ids and item scores of a per-item file (None where no judgment parsed)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no per-item score file {path}")
    ids, scores = [], []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not {"id", "score"} <= set(reader.fieldnames):
            raise ConfigError(f"{path}: expected the columns id and score (a file written by leaf eval da/likert), "
                              f"got {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            ids.append(row["id"])
            text = row["score"].strip()
            try:
                value = float(text) if text else None
            except ValueError:
                raise ConfigError(f"{path}:{line}: score {text!r} is not a number") from None
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"{path}:{line}: score {text!r} is not finite")
            scores.append(value)
    if not ids:
        raise ConfigError(f"{path} holds no items")
    return ids, scores


def score_estimate(scores: Sequence[float | None], resamples: int = 1000, seed: int = 0) -> Estimate | None:
    """Mean of the items with a score and its item bootstrap 95% CI (None if none has one)."""
    scored = [score for score in scores if score is not None]
    return bootstrap(scored, mean, resamples, seed=seed) if scored else None
