"""Evaluation: sampled decoding of a run (``sampling``; ``fresh_sampling``: scored rollout
groups for a forkability analysis), text metrics, tail risk with bootstrap CIs, absolute
LLM judges (GEMBA-DA, Likert), pairwise A/B judging, the master-table report."""

from __future__ import annotations

from leaf_plugins.evaluation.grading import PROTOCOLS, Grades, grade, read_item_scores, write_grades
from leaf_plugins.evaluation.grading_parse import Parsed, parse_da, parse_likert
from leaf_plugins.evaluation.grading_prompts import GradeItem
from leaf_plugins.evaluation.judge import JudgeRun, PairItem, judge_pairs
from leaf_plugins.evaluation.judge_model import JudgeDecoding, JudgeModel, load_judge
from leaf_plugins.evaluation.pairwise import PairwiseSummary, pair_outcomes, parse_verdict, summarize_pairs
from leaf_plugins.evaluation.tail_risk import Estimate, bootstrap, cvar, fraction_below, tail_risk_report
from leaf_plugins.evaluation.text_metrics import METRICS, RunAverage, Unavailable, average_runs, evaluate_texts

__all__ = [
    "SAMPLED_DECODING",
    "Estimate",
    "GradeItem",
    "Grades",
    "JudgeDecoding",
    "JudgeModel",
    "PROTOCOLS",
    "Parsed",
    "JudgeRun",
    "METRICS",
    "PairItem",
    "PairwiseSummary",
    "RunAverage",
    "Unavailable",
    "average_runs",
    "bootstrap",
    "cvar",
    "fraction_below",
    "grade",
    "load_judge",
    "parse_da",
    "parse_likert",
    "read_item_scores",
    "write_grades",
    "judge_pairs",
    "pair_outcomes",
    "parse_verdict",
    "summarize_pairs",
    "tail_risk_report",
    "evaluate_texts",
]

SAMPLED_DECODING = {"do_sample": True, "temperature": 0.9, "top_p": 0.9, "max_new_tokens": 200}
"""The paper's evaluation decoding (Section 4): pass to ``generate`` for each of N runs."""
