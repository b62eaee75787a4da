"""Paired differences between a study variation and its baseline variation, read from the
runs' saved files (no model is loaded).

Per run directory: the prediction files ``predictions-run<k>.jsonl`` (every decoding run)
give per-item BLEU statistics, exact matches and lengths; ``da_items.csv`` / ``likert_items.csv`` (the
study's judges) give per-item judge scores. A variation's run with seed s is paired with
the baseline's run with seed s on the same items; ``statistics.hierarchical_bootstrap``
gives the interval of the mean over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from leaf_plugins.evaluation.bleu_interval import bleu_from_statistics, bleu_statistics
from leaf_plugins.evaluation.grading import items_file, read_item_scores
from leaf_plugins.evaluation.predictions import read_predictions
from leaf_plugins.rewards import exact_match
from leaf_plugins.studies.statistics import Interval, SeedStatistic, hierarchical_bootstrap, mean_statistic

__all__ = ["PAIRED_METRICS", "RunItems", "read_run_items", "paired_difference"]

PAIRED_METRICS = {"bleu": "BLEU", "exact_match": "exact match (%)", "length": "length (words)", "da": "DA 0-100",
                  "likert": "Likert 1-5"}
"""Metrics with a paired difference, and their titles."""

JUDGES = ("da", "likert")


@dataclass
class RunItems:
    """Per-item data of one run: ids, BLEU statistics per decoding run, exact match and
    mean length and the judges' item scores (None where no judgment parsed)."""

    ids: list[str]
    bleu: torch.Tensor  # [K, n, 10] sacrebleu statistics, one slice per decoding run
    exact: torch.Tensor  # [n] percent of the decoding runs equal to the reference (the exact_match reward's test)
    length: torch.Tensor  # [n] whitespace tokens, mean over the decoding runs
    judges: dict[str, list[float | None]] = field(default_factory=dict)


def read_run_items(directory: Path) -> RunItems | None:
    """The per-item data of a finished run directory (None when it holds no predictions)."""
    files = sorted(directory.glob("predictions-run*.jsonl"), key=lambda path: int(path.stem.rsplit("run", 1)[1]))
    if not files:
        return None
    runs = [read_predictions(path) for path in files]
    ids = runs[0].ids
    for run in runs[1:]:
        if run.ids != ids:
            raise ValueError(f"{run.path} holds other items than {runs[0].path}")
    bleu = torch.stack([bleu_statistics(run.predictions, run.references) for run in runs])  # [K, n, 10]
    length = torch.tensor([[len(text.split()) for text in run.predictions] for run in runs],
                          dtype=torch.float64).mean(dim=0)  # [n]
    exact = 100 * torch.tensor([exact_match(run.predictions, run.references) for run in runs],
                               dtype=torch.float64).mean(dim=0)  # [n]
    items = RunItems(ids, bleu, exact, length)
    for name in JUDGES:
        path = directory / items_file(name)
        if path.exists():
            judged_ids, scores = read_item_scores(path)
            by_id = dict(zip(judged_ids, scores))
            items.judges[name] = [by_id.get(item) for item in ids]
    return items


def _bleu_difference(ours: torch.Tensor, theirs: torch.Tensor) -> SeedStatistic:
    """Mean over decoding runs of corpus BLEU(ours) − BLEU(theirs) on resampled items."""
    def statistic(weights: torch.Tensor) -> torch.Tensor:  # [m, n] -> [m]
        runs = [bleu_from_statistics(weights @ ours[k]) - bleu_from_statistics(weights @ theirs[k])
                for k in range(ours.shape[0])]
        return torch.stack(runs).mean(dim=0)

    return statistic


def _seed_statistic(metric: str, ours: RunItems, theirs: RunItems) -> tuple[SeedStatistic, int] | str:
    """The paired statistic of one seed and its item count, or why there is none."""
    if ours.ids != theirs.ids:
        return "the runs were evaluated on other items than the baseline's"
    if metric == "bleu":
        runs = min(ours.bleu.shape[0], theirs.bleu.shape[0])
        return _bleu_difference(ours.bleu[:runs], theirs.bleu[:runs]), len(ours.ids)
    if metric == "length":
        return mean_statistic(ours.length - theirs.length), len(ours.ids)
    if metric == "exact_match":
        return mean_statistic(ours.exact - theirs.exact), len(ours.ids)
    if metric not in ours.judges or metric not in theirs.judges:
        return "not judged (evaluation.judges)"
    pairs = [(a, b) for a, b in zip(ours.judges[metric], theirs.judges[metric]) if a is not None and b is not None]
    if not pairs:
        return "no item has a parsable judgment in both runs"
    return mean_statistic(torch.tensor([a - b for a, b in pairs], dtype=torch.float64)), len(pairs)


def paired_difference(
    metric: str, ours: Mapping[int, RunItems], theirs: Mapping[int, RunItems], resamples: int = 1000, seed: int = 0,
) -> Interval | str:
    """Mean over the seeds both variations finished of (ours − baseline) on ``metric``
    (``PAIRED_METRICS``), with its hierarchical bootstrap interval; or why there is none."""
    seeds = sorted(set(ours) & set(theirs))
    if not seeds:
        return "no seed finished by both"
    statistics, items = [], []
    for value in seeds:
        found = _seed_statistic(metric, ours[value], theirs[value])
        if isinstance(found, str):
            return found
        statistics.append(found[0])
        items.append(found[1])
    return hierarchical_bootstrap(statistics, items, resamples, seed=seed)
