"""Running a study: the warm start (once, cached), the starting model's evaluation, then
every run — trained (resuming where it stopped), evaluated, and marked finished by its
``evaluation.json``; a re-run skips finished runs. The results table is rewritten after
every run, so an interrupted study still has the table of what is finished.

Under a launch of several processes every process trains each run and samples its
share of each evaluation; the main process alone warm-starts, writes, scores, judges and
tables, while the others wait for it without a timeout (``processes.patient_barrier``),
however long that takes at 7B."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch
from accelerate import PartialState
from ruamel.yaml import YAML
from tqdm import tqdm

from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.processes import agreed_interrupt_point, patient_barrier
from leaf_plugins.core.task import Example
from leaf_plugins.studies.claims import claim
from leaf_plugins.studies.config import PlannedRun, Study, slug
from leaf_plugins.studies.evaluate import (BASELINE, EVALUATION, PREDICTIONS, evaluate_model, held_out_sampling,
                                          judge_runs, training_summary)
from leaf_plugins.studies.lock import StudyLock
from leaf_plugins.studies.results import write_results
from leaf_plugins.training.checkpoint import latest_checkpoint
from leaf_plugins.training.config import TrainConfig, task_examples
from leaf_plugins.training.durable import replace_text
from leaf_plugins.training.stage_plugins import rollout_stage

__all__ = ["run_study", "baseline_dir", "RESOLVED"]

RESOLVED = "study.resolved.yaml"
RUN_RECORD = "study_run.json"  # the run config and evaluation settings a run directory holds
WARM_START_RECORD = "warm_start.json"  # the warm-start config its directory holds
TIMES = "train_seconds.txt"  # wall time of each training session of a run (several when resumed)


def run_study(study: Study, plugins: Sequence[object] = (), host: PluginHost | None = None) -> list[Path]:
    """Run every unfinished run of ``study``. Return the paths of the files it wrote in the
    study's output directory (``write_results``'s, the table ``results.md`` first, then
    ``study.resolved.yaml``; each run writes into its own directory under ``runs/``) on
    the main process, which writes them, and an empty list on the others. ``plugins`` are
    passed to every run's trainer (observers, stage overrides)."""
    host = host or get_host()
    # under `accelerate launch`, every process trains and samples; the rest is the main one's. As the trainer's
    # Accelerator: without CUDA the processes use gloo on CPU (a plain PartialState() would make each one "main")
    state = PartialState(cpu=not torch.cuda.is_available())
    patient_barrier()  # its group is made here, while every process is at the same point
    output = study.output_dir
    with StudyLock(output) if state.is_main_process else contextlib.nullcontext():
        return _run_locked(study, plugins, host, state)


def _run_locked(study: Study, plugins: Sequence[object], host: PluginHost, state: PartialState) -> list[Path]:
    output = study.output_dir
    if state.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        _write_resolved(study, output / RESOLVED)
        if study.warm_start is not None:
            _warm_start(study, host)
    patient_barrier()
    cache: dict[tuple, list[Example]] = {}
    if state.is_main_process:
        for run in study.runs:
            _claim(run, study)
    patient_barrier()
    pending = [run for run in study.runs if not (run.directory / EVALUATION).exists()]
    if len(pending) < len(study.runs) and state.is_main_process:
        print(f"{len(study.runs) - len(pending)} of {len(study.runs)} runs already finished: skipped")
    for run in tqdm(pending, desc="study", unit="run", disable=not state.is_main_process):
        agreed_interrupt_point()
        _train(run, host, plugins, cache, state.is_main_process)
        _evaluate(study, run, host, cache)  # every process samples its share; the main one writes and scores
        if state.is_main_process:
            write_results(study)
        patient_barrier()
    if state.is_main_process:  # the judges score what they have not scored yet; the table is rewritten
        starts = [(baseline_dir(study, run.config), run.config.task.name) for run in study.runs]
        judge_runs([*dict.fromkeys(starts), *((run.directory, run.config.task.name) for run in study.runs)],
                   study.config.evaluation.judges)
        return [*write_results(study), output / RESOLVED]
    return []


def _claim(run: PlannedRun, study: Study) -> None:
    """Record what the run directory holds (its run config and the evaluation settings);
    a directory holding another configuration is an error, never silently reused."""
    evaluation = {key: value for key, value in asdict(study.config.evaluation).items() if key != "judges"}
    claim(run.directory, RUN_RECORD, {"config": asdict(run.config), "evaluation": evaluation}, "a run")


def baseline_dir(study: Study, config: TrainConfig) -> Path:
    """Where the starting model of runs with this backbone and task is evaluated."""
    return study.output_dir / BASELINE / slug(f"{config.backbone.name}-{config.task.name}")


def _evaluate_start(study: Study, config: TrainConfig, held_out: list[Example]) -> Path:
    """The starting model's predictions (evaluated once per backbone and task; by every
    process of a launch, each its share, the main one writing)."""
    directory = baseline_dir(study, config)
    if not (directory / EVALUATION).exists():
        tqdm.write(f"evaluating the starting model (no RL) -> {directory}")
        settings = study.config.evaluation
        metrics = evaluate_model(config.backbone, None, held_out, settings, held_out_sampling(settings, config.rollout),
                                 directory)
        if metrics is not None:
            replace_text(directory / EVALUATION, json.dumps(metrics, indent=1))
    return directory / PREDICTIONS


def _train(run: PlannedRun, host: PluginHost, plugins: Sequence[object], cache: dict, main: bool) -> None:
    """Train the run to its last step (resuming; nothing to do when it got there); the
    main process records the session's wall time."""
    from leaf_plugins.training.trainer import Trainer

    config = run.config
    finished = latest_checkpoint(run.directory)
    if finished is not None and finished.name == f"checkpoint-{config.steps:08d}":
        return
    if main:
        tqdm.write(f"training {run.variation}, seed {run.seed} -> {run.directory}")
    started = time.perf_counter()
    Trainer(config, _examples(host, config, config.task.split, cache), plugins=plugins, host=host).run()
    if main:
        with (run.directory / TIMES).open("a") as handle:
            handle.write(f"{time.perf_counter() - started}\n")


def _evaluate(study: Study, run: PlannedRun, host: PluginHost, cache: dict) -> None:
    """Evaluate the trained run on the held-out split; ``evaluation.json`` marks it done.
    Every process of a launch calls it and samples its share; the main one writes."""
    config, settings = run.config, study.config.evaluation
    held_out = _examples(host, config, settings.split, cache)[: settings.limit]
    baseline = _evaluate_start(study, config, held_out) if study.config.baseline else None
    started = time.perf_counter()
    sampling = held_out_sampling(settings, config.rollout, rollout_stage(config, host))
    metrics = evaluate_model(config.backbone, run.directory, held_out, settings, sampling, run.directory, baseline)
    if metrics is None:  # not the main process
        return
    metrics.update(training_summary(run.directory, settings))
    times = run.directory / TIMES
    metrics.update({"variation": run.variation, "seed": run.seed,
                    "train_seconds": sum(map(float, times.read_text().split())) if times.exists() else 0.0,
                    "evaluation_seconds": time.perf_counter() - started})
    replace_text(run.directory / EVALUATION, json.dumps(metrics, indent=1))


def _examples(host: PluginHost, config: TrainConfig, split: str, cache: dict) -> list[Example]:
    key = (config.task.name, split, json.dumps(config.task.options, sort_keys=True, default=str))
    if key not in cache:
        cache[key] = task_examples(config.task, split, host)
    return cache[key]


def _warm_start(study: Study, host: PluginHost) -> None:
    from leaf_plugins.training.warm_start import warm_start

    config = study.warm_start
    with StudyLock(Path(config.output_dir)):  # studies with other output_dirs may share a warm start
        claim(Path(config.output_dir), WARM_START_RECORD, asdict(config), "a warm start")
        if (Path(config.output_dir) / "model" / "config.json").exists():
            return
        print(f"warm start -> {config.output_dir}")
        warm_start(config, task_examples(config.task, host=host), host)


def _write_resolved(study: Study, path: Path) -> None:
    """The study as it runs: evaluation settings, warm start and every run's full config."""
    resolved = {
        "study": str(study.path),
        "evaluation": asdict(study.config.evaluation),
        "warm_start": asdict(study.warm_start) if study.warm_start else None,
        "runs": [{"variation": run.variation, "seed": run.seed, "settings": run.settings,
                  "config": asdict(run.config)} for run in study.runs],
    }
    with path.open("w") as handle:
        YAML(typ="safe", pure=True).dump(json.loads(json.dumps(resolved, default=str)), handle)
