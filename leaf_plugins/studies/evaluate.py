"""Held-out evaluation of one run of a study: sampled decoding, text metrics, corpus
BLEU with an item bootstrap interval (and the paired difference from the starting model),
forkability of the run's training rollouts, and the study's LLM judges."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from leaf_plugins.analysis.forkability import forkability_from_batches
from leaf_plugins.core.processes import group_rank
from leaf_plugins.core.task import Example
from leaf_plugins.evaluation.bleu_interval import bleu_interval, paired_bleu_interval
from leaf_plugins.evaluation.judge_model import JudgeDecoding, load_judge
from leaf_plugins.evaluation.predictions import prediction_file, read_predictions, write_predictions
from leaf_plugins.evaluation.sampling import Sampling, load_policy, sample_predictions
from leaf_plugins.evaluation.text_metrics import Unavailable, average_runs, evaluate_texts
from leaf_plugins.rollout.log import batches_from_groups, read_groups
from leaf_plugins.studies.config import EvaluationSettings, JudgeSettings, JudgesSettings
from leaf_plugins.training.config import BackboneConfig, RolloutConfig
from leaf_plugins.training.run_config import run_setting
from leaf_plugins.training.stage_plugins import RolloutStage
from leaf_plugins.training.threads import apply_threads
from leaf_plugins.training.trainer import ROLLOUT_LOG

__all__ = ["held_out_sampling", "evaluate_model", "training_summary", "judge_decoding", "judge_runs", "task_kind",
           "PREDICTIONS", "EVALUATION", "BASELINE"]

PREDICTIONS = prediction_file(0)  # the first decoding run's predictions
EVALUATION = "evaluation.json"  # written last: its presence marks the run finished
BASELINE = "baseline"  # the study subdirectory where starting models are evaluated
DEFAULT_FORK_BUDGET = 2  # the paper's B, for a run whose config names none


def held_out_sampling(settings: EvaluationSettings, rollout: RolloutConfig,
                      stage: RolloutStage | None = None) -> Sampling:
    """How a study samples a run's held-out examples: the evaluation's decoding
    (``settings``) with the run's rollout backend and its parameters (``rollout``) and
    the ``rollout`` hook of its plugins (``stage``, ``stage_plugins.rollout_stage``)."""
    return Sampling(settings.runs, settings.temperature, settings.top_p, settings.max_new_tokens,
                    settings.batch_prompts, settings.seed, rollout.backend, rollout.backend_params, stage)


def evaluate_model(
    backbone: BackboneConfig, run_dir: Path | None, examples: Sequence[Example], settings: EvaluationSettings,
    sampling: Sampling, out_dir: Path, baseline: Path | None = None,
) -> dict[str, float | str] | None:
    """Sample ``sampling.responses`` predictions per example (``held_out_sampling``) from
    the run's newest checkpoint (or the starting model when ``run_dir`` is None), write
    them to ``out_dir`` and return the metrics of ``settings`` (each averaged over the
    runs; BLEU intervals from the first run).

    Under a launch of several processes every process calls it: each samples its share of
    the examples (``sample_predictions``), and the first process (rank 0) writes the
    predictions one process writes and scores them; the others return None.

    :param baseline: a prediction file of the starting model on the same examples; the
        paired BLEU difference from it is then reported as ``delta_bleu``.
    """
    policy = load_policy(backbone, run_dir)
    apply_threads(None, policy.loaded.model, rows=sampling.batch_prompts * sampling.responses)  # as the run trains
    references = [example.reference for example in examples]
    runs = sample_predictions(policy, examples, sampling)
    if group_rank()[0] != 0:
        return None
    write_predictions(out_dir, examples, runs)
    averaged = average_runs([evaluate_texts(predictions, references, settings.metrics) for predictions in runs])
    metrics: dict[str, float | str] = {
        name: (str(value) if isinstance(value, Unavailable) else value.mean) for name, value in averaged.items()
    }
    first = bleu_interval(runs[0], references, seed=settings.seed)
    metrics.update({"bleu_run0": first.score, "bleu_low": first.low, "bleu_high": first.high, "items": len(examples)})
    if baseline is not None:
        start = read_predictions(baseline).predictions
        delta = paired_bleu_interval(runs[0], start, references, seed=settings.seed)
        metrics.update({"delta_bleu": delta.score, "delta_bleu_low": delta.low, "delta_bleu_high": delta.high})
    return metrics


def training_summary(run_dir: Path, settings: EvaluationSettings, tail: float = 0.1) -> dict[str, float]:
    """From the run's logs: mean training reward over the last ``tail`` of its steps, and
    the fork-fire and usable fork-fire rates of LEAF boundaries in its rollouts (at the
    settings' fork budget, else the run's own, from its ``config.yaml``)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-max(1, round(len(rows) * tail)):]
    out = {"train_reward_last": sum(row["reward_mean"] for row in last) / len(last)}
    log = run_dir / ROLLOUT_LOG
    if log.exists():
        batches = (batch for batch, _ in batches_from_groups(read_groups(log), 256))
        fork_budget = settings.fork_budget or run_setting(run_dir, "estimator.params.fork_budget", DEFAULT_FORK_BUDGET)
        report = forkability_from_batches(batches, fork_budget=fork_budget, tau=settings.tau,
                                          label=run_dir.name)
        summary = report.summary(resamples=200)
        out.update({"fire_rate": summary["fire_rate"], "usable_fire_rate": summary["r_f"]})
    return out


def task_kind(kind: str, task: str) -> str:
    """The judge prompt's task kind: ``kind`` itself, or for ``auto`` ``translation`` when
    the task is named ``*translation*`` or ``covost*`` and ``qa`` otherwise."""
    if kind != "auto":
        return kind
    return "translation" if "translation" in task or task.startswith("covost") else "qa"


def judge_decoding(settings: JudgeSettings, protocol_decoding: JudgeDecoding) -> JudgeDecoding:
    """How a study's judge decodes: its protocol's decoding (``protocol_decoding``) with
    the samples, temperature and token budget that ``settings`` sets (None keeps the
    protocol's) and its batch size, seed and chat-template choice."""
    given = {"samples": settings.samples, "temperature": settings.temperature,
             "max_new_tokens": settings.max_new_tokens}
    return replace(protocol_decoding, **{name: value for name, value in given.items() if value is not None},
                   batch_size=settings.batch_size, seed=settings.seed, chat_template=settings.chat_template)


def judge_runs(directories: Iterable[tuple[Path, str]], judges: JudgesSettings) -> None:
    """Grade the first decoding run's predictions of every ``(directory, task name)`` with
    each judge that names a model, skipping directories that already hold its per-item
    file (so judges added to a finished study score it without retraining). Each judge
    model is loaded once for all directories."""
    from leaf_plugins.evaluation.grading import grade, grade_items, items_file, protocol, write_grades

    directories = list(directories)
    for name in ("da", "likert"):
        settings = getattr(judges, name)
        todo = [(directory, task) for directory, task in directories
                if settings.model is not None and (directory / PREDICTIONS).exists()
                and not (directory / items_file(name)).exists()]
        if not todo:
            continue
        decoding = judge_decoding(settings, protocol(name).decoding)  # checked before the judge is loaded
        judge = load_judge(settings.model, settings.device, settings.dtype)
        for directory, task in todo:
            items = grade_items(read_predictions(directory / PREDICTIONS))
            grades = grade(judge, items, name, decoding, kind=task_kind(settings.task, task))
            write_grades(grades, directory)
