"""The results of a study: per variation, the mean over seeds of every metric with a
percentile bootstrap 95% CI over seeds (Markdown and CSV); per run, the held-out BLEU
with its item bootstrap CI; and learning curves as a PNG."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch

from leaf_plugins.studies.config import Study
from leaf_plugins.studies.evaluate import BASELINE, EVALUATION

__all__ = ["write_results", "seed_interval", "COLUMNS"]

# metric key → column title, in table order (metrics a study did not compute are left out)
COLUMNS = {
    "bleu": "held-out BLEU", "delta_bleu": "ΔBLEU vs start", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2",
    "rougeL": "ROUGE-L", "meteor": "METEOR", "bertscore_f1": "BERTScore-F1", "length": "length (words)",
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


def _finished(study: Study) -> list[dict]:
    rows = []
    for run in study.runs:
        path = run.directory / EVALUATION
        if path.exists():
            rows.append({**json.loads(path.read_text()), "variation": run.variation, "seed": run.seed,
                         "directory": str(run.directory)})
    return rows


def _cell(mean: float, low: float, high: float, percent: bool) -> str:
    scale, unit = (100.0, "%") if percent else (1.0, "")
    if math.isnan(low):
        return f"{mean * scale:.2f}{unit}"
    return f"{mean * scale:.2f}{unit} [{low * scale:.2f}, {high * scale:.2f}]"


def write_results(study: Study) -> Path:
    """Write ``results.md``, ``results.csv``, ``results_runs.csv`` and
    ``learning_curves.png`` into the study's output directory; return ``results.md``."""
    output = study.output_dir
    rows = _finished(study)
    numeric = [key for key in COLUMNS if rows and all(isinstance(row.get(key), (int, float)) for row in rows)]
    unavailable = {key: row[key] for row in rows for key in COLUMNS if isinstance(row.get(key), str)}
    table, records = [], []
    for variation in study.variations:
        chosen = [row for row in rows if row["variation"] == variation]
        if not chosen:
            continue
        record: dict = {"variation": variation, "seeds": len(chosen)}
        cells = [variation, str(len(chosen))]
        for key in numeric:
            mean, low, high = seed_interval([float(row[key]) for row in chosen])
            record.update({key: mean, f"{key}_low": low, f"{key}_high": high})
            cells.append(_cell(mean, low, high, percent=key.endswith("fire_rate")))
        records.append(record)
        table.append("| " + " | ".join(cells) + " |")
    header = ["variation", "seeds", *(COLUMNS[key] for key in numeric)]
    lines = [f"# {study.path.name}: {len(rows)} of {len(study.runs)} runs finished", "",
             "Mean over seeds [percentile bootstrap 95% CI over seeds].", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *table]
    lines += _start_lines(study)
    lines += [f"- {COLUMNS[key]}: {message}" for key, message in unavailable.items()]
    (output / "results.md").write_text("\n".join(lines) + "\n")
    _write_csv(output / "results.csv", records)
    _write_csv(output / "results_runs.csv", rows)
    if rows:
        _plot_learning_curves(study, output / "learning_curves.png")
    return output / "results.md"


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
    axis.set_xlabel("step")
    axis.set_ylabel("mean training reward (moving average)")
    axis.set_title(study.path.name)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
