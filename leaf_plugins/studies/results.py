"""The results of a study, rendered from its saved files only (no model is loaded, nothing
is retrained): per variation, the mean over seeds of every metric; per variation, the
paired difference to its baseline variation (``compare_to``: a variation, default the
first, or a grid setting such as ``estimator=grpo``; ``Study.baseline_of``) with a
hierarchical bootstrap interval over seeds and items; per run, every metric
(``results_runs.csv``); and learning curves as a PNG.

Seed-level intervals need enough seeds (``statistics.MIN_SEEDS_FOR_INTERVAL``): with fewer,
the per-variation cells show the lowest and highest seed instead of an interval, and the
paired differences resample items within the fixed seeds, each table saying so. The
interquartile mean over seeds (rliable's IQM) is shown when some variation has at least
``statistics.MIN_SEEDS_FOR_IQM`` seeds.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch

from leaf_plugins.core.errors import LeafError
from leaf_plugins.evaluation.grading import items_file, read_item_scores
from leaf_plugins.studies.config import Study
from leaf_plugins.studies.evaluate import BASELINE, EVALUATION
from leaf_plugins.studies.paired import PAIRED_METRICS, paired_difference, read_run_items
from leaf_plugins.studies.statistics import (MIN_SEEDS_FOR_INTERVAL, MIN_SEEDS_FOR_IQM, Interval,
                                             interquartile_mean)

__all__ = ["write_results", "seed_interval", "COLUMNS"]

# metric key → column title, in table order (metrics a study did not compute are left out)
COLUMNS = {
    "bleu": "held-out BLEU", "delta_bleu": "ΔBLEU vs start", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2",
    "rougeL": "ROUGE-L", "meteor": "METEOR", "bertscore_f1": "BERTScore-F1", "length": "length (words)",
    "likert": "Likert 1-5", "da": "DA 0-100",
    "usable_fire_rate": "usable fork-fire rate", "fire_rate": "fork-fire rate",
    "train_reward_last": "train reward (last 10%)",
}
RESAMPLES = 1000


def seed_interval(values: list[float], resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """Mean and percentile bootstrap 95% CI of the mean over seeds (NaN bounds for one
    seed: no interval)."""
    data = torch.tensor(values, dtype=torch.float64)
    mean = float(data.mean())
    if data.numel() < 2:
        return mean, math.nan, math.nan
    generator = torch.Generator().manual_seed(seed)
    means = data[torch.randint(data.numel(), (resamples, data.numel()), generator=generator)].mean(dim=1)  # [R]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return mean, low, high


def _judge_means(directory: Path) -> dict[str, float]:
    """Mean item score of each judge file of a run (items without a parsable judgment left out)."""
    out = {}
    for name in ("likert", "da"):
        path = directory / items_file(name)
        if path.exists():
            scores = [score for score in read_item_scores(path)[1] if score is not None]
            if scores:
                out[name] = sum(scores) / len(scores)
    return out


def _finished(study: Study) -> list[dict]:
    rows = []
    for run in study.runs:
        path = run.directory / EVALUATION
        if path.exists():
            rows.append({**json.loads(path.read_text()), **_judge_means(run.directory), "variation": run.variation,
                         "seed": run.seed, "directory": str(run.directory)})
    return rows


def _cell(values: list[float], percent: bool) -> tuple[str, dict]:
    """The table cell of one metric of one variation, and its CSV fields."""
    scale, unit = (100.0, "%") if percent else (1.0, "")
    mean, low, high = seed_interval(values)
    record = {"": mean, "_low": math.nan, "_high": math.nan, "_min": min(values), "_max": max(values),
              "_iqm": interquartile_mean(values)}
    if len(values) >= MIN_SEEDS_FOR_INTERVAL:
        record.update({"_low": low, "_high": high})
        return f"{mean * scale:.2f}{unit} [{low * scale:.2f}, {high * scale:.2f}]", record
    if len(values) == 1:
        return f"{mean * scale:.2f}{unit}", record
    return f"{mean * scale:.2f}{unit} ({min(values) * scale:.2f}–{max(values) * scale:.2f})", record


def write_results(study: Study) -> list[Path]:
    """Write ``results.md``, ``results.csv``, ``results_runs.csv`` and
    ``learning_curves.png`` into the study's output directory from its saved files;
    return their paths, ``results.md`` first. A study none of whose runs has finished has
    no table: that is a ``LeafError`` saying so (nothing is written)."""
    output = study.output_dir
    rows = _finished(study)
    if not rows:
        raise LeafError(f"{study.path}: none of its {len(study.runs)} runs has finished yet (a finished run has "
                        f"{EVALUATION} in its directory under {output}), so there is no table: run "
                        f"`leaf study {study.path}` first")
    numeric = [key for key in COLUMNS if rows and all(isinstance(row.get(key), (int, float)) for row in rows)]
    unavailable = {key: row[key] for row in rows for key in COLUMNS if isinstance(row.get(key), str)}
    by_variation = {v: [row for row in rows if row["variation"] == v] for v in study.variations}
    by_variation = {v: chosen for v, chosen in by_variation.items() if chosen}
    fewest = min((len(chosen) for chosen in by_variation.values()), default=0)
    iqm = any(len(chosen) >= MIN_SEEDS_FOR_IQM for chosen in by_variation.values()) and "bleu" in numeric
    table, records = [], {}
    for variation, chosen in by_variation.items():
        record: dict = {"variation": variation, "seeds": len(chosen)}
        cells = [variation, str(len(chosen))]
        for key in numeric:
            text, fields = _cell([float(row[key]) for row in chosen], percent=key.endswith("fire_rate"))
            record.update({key + suffix: value for suffix, value in fields.items()})
            cells.append(text)
        if iqm:
            cells.append(f"{record['bleu_iqm']:.2f}" if len(chosen) >= MIN_SEEDS_FOR_IQM else
                         f"n/a ({len(chosen)} seeds)")
        records[variation] = record
        table.append("| " + " | ".join(cells) + " |")
    header = ["variation", "seeds", *(COLUMNS[key] for key in numeric), *(["IQM BLEU over seeds"] if iqm else [])]
    lines = [f"# {study.path.name}: {len(rows)} of {len(study.runs)} runs finished", "", _spread_note(fewest), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *table]
    lines += _paired_lines(study, by_variation, records)
    lines += _start_lines(study)
    notes = [f"- {COLUMNS[key]}: {message}" for key, message in unavailable.items()]
    if not iqm and by_variation:
        notes.append(f"- IQM over seeds (rliable) not shown: it needs >= {MIN_SEEDS_FOR_IQM} seeds per variation.")
    lines += ["", *notes] if notes else []
    table_path, variations_csv, runs_csv, curves_png = (output / "results.md", output / "results.csv",
                                                        output / "results_runs.csv", output / "learning_curves.png")
    table_path.write_text("\n".join(lines) + "\n")
    _write_csv(variations_csv, list(records.values()))
    _write_csv(runs_csv, rows)
    _plot_learning_curves(study, curves_png)
    return [table_path, variations_csv, runs_csv, curves_png]


def _spread_note(fewest: int) -> str:
    if fewest >= MIN_SEEDS_FOR_INTERVAL:
        return "Mean over seeds [percentile bootstrap 95% CI over seeds]."
    count = "1 seed per variation is" if fewest == 1 else f"{fewest} seeds per variation are"
    return (f"Mean over seeds (lowest–highest seed). Not an interval: {count} too few for a seed-level "
            f"confidence interval (>= {MIN_SEEDS_FOR_INTERVAL} needed).")


def _paired_lines(study: Study, by_variation: dict[str, list[dict]], records: dict[str, dict]) -> list[str]:
    """The table of paired differences to each variation's baseline (records get its
    fields): BLEU and length always, held-out exact match when a run trains on the
    ``exact_match`` reward, the judges' scores when they judged."""
    items = {variation: {row["seed"]: read_run_items(Path(row["directory"])) for row in chosen}
             for variation, chosen in by_variation.items()}
    items = {v: {s: found for s, found in runs.items() if found is not None} for v, runs in items.items()}
    baselines = {variation: study.baseline_of(variation) for variation in items}
    target = study.config.compare_to or study.variations[0]
    if not any(baseline and baseline != variation for variation, baseline in baselines.items()):
        return []
    trained_on_exact_match = any(run.config.reward == "exact_match" for run in study.runs)
    metrics = [key for key in PAIRED_METRICS if key in ("bleu", "length")
               or (key == "exact_match" and trained_on_exact_match)
               or any(key in found.judges for runs in items.values() for found in runs.values())]
    header = ["variation", "baseline", "seeds paired", *(f"Δ{PAIRED_METRICS[key]}" for key in metrics),
              "interval over"]
    lines = ["", f"Paired difference vs {target} (same seeds, same items): mean over seeds of the per-seed "
             f"difference [hierarchical bootstrap 95% CI: seeds resampled, then items within each seed; "
             f"{RESAMPLES} resamples].", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variation, runs in items.items():
        baseline = baselines[variation]
        if baseline is None or baseline == variation:
            continue
        theirs = items.get(baseline, {})
        cells, kinds = [variation, baseline, str(len(set(runs) & set(theirs)))], set()
        for key in metrics:
            found = paired_difference(key, runs, theirs, RESAMPLES)
            if isinstance(found, Interval):
                records[variation].update({f"delta_{key}": found.value, f"delta_{key}_low": found.low,
                                           f"delta_{key}_high": found.high,
                                           f"delta_{key}_seed_level": found.seed_level})
                cells.append(str(found))
                kinds.add(_interval_kind(found))
            else:
                cells.append(f"n/a: {found}")
        cells.append("; ".join(sorted(kinds)) or "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _interval_kind(found: Interval) -> str:
    if found.seed_level:
        return "seeds and items"
    return (f"items only: {found.seeds} seed{'s' * (found.seeds != 1)} too few for a seed-level interval "
            f"(>= {MIN_SEEDS_FOR_INTERVAL})")


def _start_lines(study: Study) -> list[str]:
    lines = []
    for path in sorted((study.output_dir / BASELINE).glob(f"*/{EVALUATION}")):
        start = json.loads(path.read_text())
        lines.append(f"\nStarting model (no RL, {path.parent.name}): held-out BLEU {start['bleu']:.2f} "
                     f"(first run {start['bleu_run0']:.2f} [{start['bleu_low']:.2f}, {start['bleu_high']:.2f}], "
                     f"item bootstrap 95% CI, {start['items']} examples), length {start.get('length', math.nan):.2f}.")
    return lines


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _plot_learning_curves(study: Study, path: Path) -> None:
    """Training reward per step (moving average), mean over seeds, one line per variation."""
    from leaf_plugins.analysis.plots import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    for variation in study.variations:
        curves = []
        for run in (run for run in study.runs if run.variation == variation):
            log = run.directory / "metrics.jsonl"
            if log.exists() and (run.directory / EVALUATION).exists():
                curves.append([json.loads(line)["reward_mean"] for line in log.read_text().splitlines()])
        if not curves:
            continue
        width = min(len(curve) for curve in curves)
        mean = torch.tensor([curve[:width] for curve in curves], dtype=torch.float64).mean(dim=0)  # [S]
        window = max(1, width // 10)
        smooth = torch.nn.functional.avg_pool1d(mean.view(1, 1, -1), window, stride=1).view(-1)  # [S - w + 1]
        axis.plot(range(window, width + 1), smooth.tolist(), label=f"{variation} ({len(curves)} seeds)")
    axis.set_xlabel("RL step")
    axis.set_ylabel(f"training reward ({study.runs[0].config.reward}), mean of a step" if study.runs else "training reward")
    axis.set_title(f"{study.path.name}: moving average over a tenth of the steps, mean over seeds", fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
