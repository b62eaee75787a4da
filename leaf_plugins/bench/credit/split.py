"""The credit benchmark split into a design set and a report set.

A rule for an estimator (``tree_otb``'s tree weight, its ridge, its bins) is chosen on
the **design set** only: the regimes of ``leaf bench credit`` and of ``--held-out``,
which earlier rules were already looked at and tuned on. The **report set** below was
fixed before any estimator was run on it, and it is never used to choose a rule: a
change is judged by what it does there, in every regime, and the set stays as it is so
that the next change is judged the same way (``leaf bench credit --report-set``).

The report set covers fixed length (the additive reward: the benchmark's exact-match and
BLEU-like rewards need an end token) and variable length, graded (additive or BLEU-like)
and exact-match rewards, shared parameters across states (``features``, LoRA-like),
vocabularies from 3 to 16 words, 2 to 4 plausible variants at a BLEU-like or exact-match
decision, group sizes K = 4, 8 and 16, and estimator calls on batches of 2, 4 and 8 groups (a training step's
prompts: an estimator that learns from the other groups of its batch sees only that
many).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import advantages_of
from leaf_plugins.bench.credit.measures import Interval, interval, measure_credit
from leaf_plugins.bench.credit.sampling import sample_groups
from leaf_plugins.bench.estimator_choice import EstimatorChoice

__all__ = ["report_regimes", "design_regime_names", "graded", "PairedRow", "paired_report", "report_table"]

_GRADED_ENDING = Regime(name="", horizon=26, vocab=10, reference_length=18, decisions=(3, 9, 14), reward="graded",
                        variants=3, peak_logit=6.5)


def report_regimes() -> list[Regime]:
    """The report set (see the module): never used to choose a rule."""
    return [
        Regime(name="report: additive, 20 tokens, vocabulary 6, K=4", horizon=20, vocab=6, decisions=(2, 7, 13),
               group_size=4, batch_groups=4),
        Regime(name="report: additive, 14 tokens, vocabulary 10, 4 decisions, K=16", horizon=14, vocab=10,
               decisions=(1, 4, 8, 11), group_size=16, batch_groups=2),
        Regime(name="report: additive, 18 tokens, vocabulary 3, late decisions, temperature 1.5, noise 0.1, K=8",
               horizon=18, vocab=3, decisions=(9, 15), temperature=1.5, reward_noise=0.1, batch_groups=8),
        Regime(name="report: additive, 24 tokens, vocabulary 5, features α=0.7, K=8", horizon=24, vocab=5,
               decisions=(4, 11, 19), features=48, feature_similarity=0.7, batch_groups=4),
        replace(_GRADED_ENDING, name="report: graded, 18 words, vocabulary 10, K=8", batch_groups=2),
        replace(_GRADED_ENDING, name="report: graded, 12 words, vocabulary 14, features α=0.3, K=16", vocab=14,
                horizon=18, reference_length=12, decisions=(2, 6, 9), features=64, feature_similarity=0.3,
                group_size=16, batch_groups=4),
        replace(_GRADED_ENDING, name="report: graded, length decision, 20 words, vocabulary 9, K=4", vocab=9,
                horizon=28, reference_length=20, decisions=(3, 10, 16), stop_logit=0.5, right_bias=3.0,
                group_size=4, batch_groups=8),
        replace(_GRADED_ENDING, name="report: graded, 24 words, 6 decisions, 2 variants, features α=0.9, K=8",
                vocab=12, horizon=30, reference_length=24, decisions=(2, 6, 10, 14, 18, 21), variants=2,
                features=64, feature_similarity=0.9, temperature=1.2, batch_groups=8),
        replace(_GRADED_ENDING, name="report: exact match, 14 words, vocabulary 10, K=4", reward="exact",
                horizon=20, reference_length=14, decisions=(2, 7, 11), right_bias=2.0, group_size=4,
                batch_groups=2),
        replace(_GRADED_ENDING, name="report: exact match, 16 words, vocabulary 14, features α=0.7, K=16",
                reward="exact", vocab=14, horizon=22, reference_length=16, decisions=(3, 8, 13), right_bias=3.0,
                features=64, feature_similarity=0.7, group_size=16, batch_groups=4),
        replace(_GRADED_ENDING, name="report: exact match, length decision, 28 words, vocabulary 16, K=8",
                reward="exact", vocab=16, horizon=36, reference_length=28, decisions=(4, 12, 20, 25),
                peak_logit=6.0, stop_logit=1.0, right_bias=4.0, batch_groups=2),
        replace(_GRADED_ENDING, name="report: exact match, 4 variants, B=4, vocabulary 8, K=8", reward="exact",
                vocab=8, variants=4, fork_budget=4, right_bias=3.0, batch_groups=8),
    ]


def design_regime_names() -> list[str]:
    """Every regime a rule may be chosen on: ``leaf bench credit`` and ``--held-out``."""
    from leaf_plugins.bench.credit.sweep import held_out_regimes, regimes

    return [regime.name for regime in regimes() + held_out_regimes()]


def graded(regime: Regime) -> bool:
    """Whether a regime's reward is graded (additive or BLEU-like), not exact match."""
    return regime.reward != "exact"


@dataclass(frozen=True)
class PairedRow:
    """Paired per-group gradient-cosine differences of one estimator in one regime."""

    regime: str
    estimator: str
    graded: bool
    cosine: Interval
    minus: dict[str, Interval]  # baseline name -> paired difference (mean, 95% CI over groups)


def paired_report(chosen: list[Regime], estimator: EstimatorChoice = EstimatorChoice("tree_otb"),
                  baselines: tuple[str, ...] = ("otb", "grpo"), seeds: int = 3, groups: int = 200) -> list[PairedRow]:
    """Per regime, ``estimator``'s per-group gradient cosine (at the parameters chosen)
    and its paired difference to each baseline (at its defaults) on the very same groups
    (``seeds`` environments × ``groups`` groups; a group where either gradient is 0 is
    left out of that pair)."""
    rows = []
    compared = {estimator.label: estimator, **{name: EstimatorChoice(name) for name in baselines}}
    for regime in chosen:
        cosines: dict[str, list[torch.Tensor]] = {label: [] for label in compared}
        for seed in range(seeds):
            env = Environment.build(regime, seed)
            sampled = sample_groups(env, groups, torch.Generator().manual_seed(seed))
            for label, choice in compared.items():
                advantages = advantages_of(choice, env, sampled)[0]
                cosines[label].append(measure_credit(env, sampled, advantages).group_cosines)
        own = torch.cat(cosines[estimator.label])
        minus = {name: interval(own - torch.cat(cosines[name])) for name in baselines}
        rows.append(PairedRow(regime.name, estimator.label, graded(regime), interval(own), minus))
    return rows


ROUNDING = 5e-5
"""Half the last printed digit: a difference whose interval clears 0 by less is printed
as 0 and is not called significant (two estimators that agree to float rounding)."""


def significant(value: Interval) -> int:
    """1 if the 95% interval lies above 0 (by more than ``ROUNDING``), −1 if below, else 0."""
    if value.mean - value.half_width > ROUNDING:
        return 1
    return -1 if value.mean + value.half_width < -ROUNDING else 0


def _cell(value: Interval) -> str:
    text = f"{value.mean:+.4f} ± {value.half_width:.4f}"
    return f"**{text}**" if significant(value) else text


def report_table(rows: list[PairedRow]) -> str:
    """A markdown table of ``paired_report`` rows and a one-line summary per baseline
    (bold: the 95% CI excludes 0, by more than the printed rounding)."""
    baselines = list(rows[0].minus) if rows else []
    lines = ["| regime | reward | " + rows[0].estimator + " cosine | " if rows else "| regime |"]
    lines[0] += " | ".join(f"− {name}, paired" for name in baselines) + " |"
    lines.append("|---|---|---|" + "---|" * len(baselines))
    for row in rows:
        cells = " | ".join(_cell(row.minus[name]) for name in baselines)
        lines.append(f"| {row.regime} | {'graded' if row.graded else 'exact'} | {row.cosine:.4f} | {cells} |")
    lines.append("")
    for name in baselines:
        differences = [row.minus[name] for row in rows]
        better = sum(significant(d) > 0 for d in differences)
        worse = sum(significant(d) < 0 for d in differences)
        clearly_worse = sum(significant(d) < 0 and -d.mean > 0.003 for d in differences)
        graded_rows = [row.minus[name] for row in rows if row.graded]
        graded_better = sum(significant(d) > 0 for d in graded_rows)
        graded_mean = sum(d.mean for d in graded_rows) / len(graded_rows) if graded_rows else float("nan")
        lines.append(f"* vs `{name}`: significantly better in {better} of {len(rows)}, significantly worse in "
                     f"{worse} ({clearly_worse} of them by more than 0.003); graded: better in {graded_better} of "
                     f"{len(graded_rows)}, mean difference {graded_mean:+.4f}.")
    return "\n".join(lines) + "\n"
