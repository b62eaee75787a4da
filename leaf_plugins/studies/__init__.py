"""YAML-declared ablation studies: a base run, variations (a grid, a list) and seeds;
every run trained, evaluated on held-out examples, and summarised in one table."""

from leaf_plugins.studies.config import EvaluationSettings, PlannedRun, Study, StudyConfig, load_study

__all__ = ["EvaluationSettings", "PlannedRun", "Study", "StudyConfig", "load_study"]
