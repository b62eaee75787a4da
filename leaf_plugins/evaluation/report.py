"""The paper's master table (Table ``tab:master``) for a set of run directories.

A run directory holds the prediction files of one system (``predictions-run<k>.jsonl``,
from ``leaf eval generate`` or a study run) and what scored them, all read from files:

* text metrics: ``metrics.csv`` (``leaf eval metrics --out RUN_DIR``) or a study run's
  ``evaluation.json``; BLEU, R-1, R-2, R-L, METEOR, BS-F1, Pred tok (mean prediction length
  in whitespace tokens), each the mean over the decoding runs;
* judges: ``likert_items.csv`` and ``da_items.csv`` (``leaf eval likert|da --out RUN_DIR``);
  the mean item score with its item bootstrap 95% CI, as the paper reports them.

A column with no file behind it is shown as unavailable, and the notes under the table give
the command that fills it.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from leaf_plugins.evaluation.grading import items_file, read_item_scores, score_estimate
from leaf_plugins.evaluation.tail_risk import Estimate

__all__ = ["COLUMNS", "RunRow", "read_run", "render"]

COLUMNS = {"bleu": "BLEU", "rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L", "meteor": "METEOR",
           "bertscore_f1": "BS-F1", "length": "Pred tok", "likert": "Likert 1-5", "da": "DA 0-100"}
"""Column key → title, in the paper's order."""

TEXT_METRICS = ("bleu", "rouge1", "rouge2", "rougeL", "meteor", "bertscore_f1", "length")
JUDGES = ("likert", "da")


@dataclass
class RunRow:
    """One run directory's cells: a number, an ``Estimate`` (judges) or why it is missing."""

    name: str
    directory: Path
    values: dict[str, float | Estimate] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # column → the note (reason and command)
    notes: list[str] = field(default_factory=list)


def _predictions(directory: Path) -> list[Path]:
    return sorted(directory.glob("predictions-run*.jsonl"))


def _text_metrics(directory: Path) -> tuple[dict[str, float | str], str | None]:
    """Text metrics of a run directory and the file they came from."""
    table = directory / "metrics.csv"
    if table.exists():
        with table.open(newline="") as handle:
            rows = {row["metric"]: row["mean"] for row in csv.DictReader(handle)}
        return {key: _float_or_text(value) for key, value in rows.items()}, table.name
    evaluation = directory / "evaluation.json"
    if evaluation.exists():
        data = json.loads(evaluation.read_text())
        return {key: data[key] for key in TEXT_METRICS if key in data}, evaluation.name
    return {}, None


def _float_or_text(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def read_run(directory: str | Path, name: str | None = None) -> RunRow:
    """The master-table row of ``directory`` (see the module doc)."""
    directory = Path(directory)
    row = RunRow(name or str(directory), directory)
    predictions = _predictions(directory)
    files = " ".join(str(path) for path in predictions) or f"{directory}/predictions-run0.jsonl"
    first = predictions[0] if predictions else directory / "predictions-run0.jsonl"
    metrics, source = _text_metrics(directory)
    fill = f"leaf eval metrics --predictions {files} --out {directory}"
    for key in TEXT_METRICS:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            row.values[key] = float(value)
        elif isinstance(value, str):
            row.missing[key] = f"{value} (from {source})"
        else:
            row.missing[key] = f"not computed: `{fill}`" + (" (the study's evaluation.metrics can add it too)"
                                                            if source == "evaluation.json" else "")
    for key in JUDGES:
        path = directory / items_file(key)
        if not path.exists():
            row.missing[key] = f"not judged: `leaf eval {key} --judge MODEL --predictions {first} --out {directory}`"
            continue
        _, scores = read_item_scores(path)
        estimate = score_estimate(scores)
        unparsable, judgments = _judgment_counts(path)
        without = sum(score is None for score in scores)
        row.notes.append(f"{COLUMNS[key]}: {len(scores)} items, {unparsable} of {judgments} judgments unparsable"
                         f"{f', {without} without a parsable judgment (left out of the mean)' if without else ''}"
                         f" ({path})")
        if estimate is None:
            row.missing[key] = f"no judgment in {path} parsed"
        else:
            row.values[key] = estimate
    return row


def _judgment_counts(path: Path) -> tuple[int, int]:
    """(unparsable, all) judgments of a per-item file."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    unparsable = sum(int(row["unparsable"]) for row in rows)
    return unparsable, unparsable + sum(int(row["parsed"]) for row in rows)


def _cell(value: float | Estimate | None, key: str) -> str:
    if value is None:
        return "unavailable"
    if isinstance(value, Estimate):
        return f"{value.value:.2f} [{value.low:.2f}, {value.high:.2f}]"
    return f"{value:.1f}" if key == "length" else f"{value:.2f}"


def render(rows: Sequence[RunRow], out_dir: str | Path) -> tuple[str, Path, Path]:
    """Write ``report.md`` and ``report.csv`` for ``rows`` into ``out_dir``; return the
    Markdown text and both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = ["run", *COLUMNS.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join([row.name, *(_cell(row.values.get(key), key) for key in COLUMNS)]) + " |")
    lines += ["", "Text metrics: mean over the decoding runs; Pred tok in whitespace tokens. Likert and DA: mean item "
              "score [item bootstrap 95% CI, 1000 resamples]."]
    for row in rows:
        reasons: dict[str, list[str]] = {}
        for key, reason in row.missing.items():
            reasons.setdefault(reason, []).append(COLUMNS[key])
        notes = row.notes + [f"{', '.join(columns)} unavailable: {reason}" for reason, columns in reasons.items()]
        if notes:
            lines.append(f"\n{row.name}:")
            lines += [f"- {note}" for note in notes]
    text = "\n".join(lines) + "\n"
    markdown = out_dir / "report.md"
    markdown.write_text(text)
    table = out_dir / "report.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", *(name for key in COLUMNS for name in (
            (key, f"{key}_low", f"{key}_high") if key in JUDGES else (key,)))])
        for row in rows:
            cells = [row.name]
            for key in COLUMNS:
                value = row.values.get(key)
                if isinstance(value, Estimate):
                    cells += [value.value, value.low, value.high]
                elif key in JUDGES:
                    cells += ["unavailable", "", ""]
                else:
                    cells.append("unavailable" if value is None else value)
            writer.writerow(cells)
    return text, markdown, table
