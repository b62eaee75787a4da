"""The regimes of the benchmark, running them, and the results table."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import ORACLE, advantages_of, estimator_names
from leaf_plugins.bench.credit.learning import PROTOCOLS, learning_curve
from leaf_plugins.bench.credit.measures import (
    Bias, CreditMeasures, Interval, forkability, gradient_bias, interval, measure_credit, student_interval,
)
from leaf_plugins.bench.credit.sampling import Groups, sample_groups
from leaf_plugins.bench.estimator_choice import EstimatorChoice
from leaf_plugins.core.interrupts import interrupt_point

__all__ = ["Settings", "Row", "regimes", "held_out_regimes", "run_sweep", "paired_cosine_gain", "paired_learning_gain",
           "markdown_table", "write_csv", "BASELINES"]

BASE = Regime()
SPEECH = Regime(
    name="graded", horizon=24, vocab=16, reference_length=16, decisions=(3, 8, 12), reward="graded",
    variants=3, peak_logit=7.0,
)
"""Translation-like: 16 reference words then the end token, three decisions among three
plausible variants, a rare wrong word at every other position (costs ρ = 0.5 of the
reward), stopping early or late costs words."""

EXACT = replace(SPEECH, name="exact match", reward="exact", right_bias=1.0)

LENGTH = replace(EXACT, name="exact match, length decision", vocab=12, horizon=32, reference_length=24,
                 decisions=(3, 8, 12, 18), peak_logit=6.0, stop_logit=1.0, right_bias=4.0)
"""Exact match where one wrong token or a wrong length zeroes the reward: 24 reference
words over a 12-word vocabulary, a rare wrong word twice as likely at every position as
in ``EXACT`` (peak logit 6), decisions that mostly go right (right bias 4), and the
length decision after the last word a real one (the end token's logit 1: about one in
five responses that got that far stops there). The regime that shows how much the
prefix tree's node values cost ``tree_otb`` under exact match (docs/credit-benchmark.md)."""
BASELINES = ("grpo", "otb")
"""The estimators every other one is compared with, pair by pair on the same groups."""


def regimes() -> list[Regime]:
    """The first version's additive regimes (fixed length, one knob at a time), then
    translation-like ones with an end token, graded or exact-match rewards, longer
    horizons, shared features and a hard exact-match regime, then the length-decision
    family (exact match and graded)."""
    return [
        BASE,
        replace(BASE, name="K=4", group_size=4),
        replace(BASE, name="K=16", group_size=16),
        replace(BASE, name="B=1", fork_budget=1),
        replace(BASE, name="B=4", fork_budget=4),
        replace(BASE, name="1 early decision", decisions=(2,)),
        replace(BASE, name="5 decisions", decisions=(1, 4, 7, 10, 13)),
        replace(BASE, name="late decisions", decisions=(12, 14)),
        replace(BASE, name="reward noise 0.2", reward_noise=0.2),
        replace(BASE, name="temperature 2", temperature=2.0),
        SPEECH,
        replace(SPEECH, name="graded K=4", group_size=4),
        replace(SPEECH, name="graded K=16", group_size=16),
        replace(SPEECH, name="graded noise 0.1", reward_noise=0.1),
        replace(SPEECH, name="graded temperature 1.5", temperature=1.5),
        replace(SPEECH, name="graded long (48 words)", horizon=56, reference_length=48,
                decisions=(4, 12, 20, 28, 36, 44), variants=2),
        replace(SPEECH, name="graded features α=0", features=64, feature_similarity=0.0),
        replace(SPEECH, name="graded features α=0.5", features=64, feature_similarity=0.5),
        replace(SPEECH, name="graded features α=0.9", features=64, feature_similarity=0.9),
        EXACT,
        replace(EXACT, name="exact match K=16", group_size=16),
        replace(EXACT, name="exact match late", decisions=(10, 13), variants=2),
        replace(EXACT, name="exact match hard", right_bias=0.0, decisions=(3, 6, 9, 12)),
        LENGTH,
        replace(LENGTH, name="exact match, length decision K=16", group_size=16),
        replace(LENGTH, name="exact match, length decision hard", right_bias=2.0),
        replace(LENGTH, name="graded, length decision", reward="graded"),
    ]


def held_out_regimes() -> list[Regime]:
    """Settings the rule of ``tree_otb`` was not chosen on (another vocabulary, horizon,
    group size, temperature, shared features), for ``leaf bench credit --held-out``."""
    return [
        replace(EXACT, name="held out: exact match, vocabulary 20, 40 words, K=12", vocab=20, horizon=48,
                reference_length=40, decisions=(5, 15, 25, 35), stop_logit=1.5, peak_logit=6.5, right_bias=4.0,
                group_size=12),
        replace(SPEECH, name="held out: graded, vocabulary 8, 12 words, K=6", vocab=8, horizon=18, reference_length=12,
                decisions=(2, 6, 9), stop_logit=1.0, peak_logit=5.0, group_size=6),
        replace(EXACT, name="held out: exact match, vocabulary 8, 20 words, K=6, temperature 1.3", vocab=8, horizon=28,
                reference_length=20, decisions=(4, 10, 15), temperature=1.3, right_bias=3.0, group_size=6),
        replace(LENGTH, name="held out: graded, length decision, features α=0.5", reward="graded", features=64,
                feature_similarity=0.5),
        replace(LENGTH, name="held out: exact match, length decision, features α=0.5, K=12", features=64,
                feature_similarity=0.5, group_size=12),
    ]


@dataclass(frozen=True)
class Settings:
    """How much work one run does (``quick`` for tests)."""

    seeds: int = 3  # environments per regime for the gradient and credit measures
    groups: int = 200  # groups per seed for the gradient and credit measures
    bias_groups: int = 2000  # groups (one environment) for the bias of the mean gradient
    learning_seeds: int = 10  # learning curves per regime, estimator and protocol (seed s: the same for all)
    steps: int = 30  # policy-gradient steps of the learning curves
    groups_per_step: int = 8
    learning_rate: float = 0.25  # the normalised protocol's step size
    direction_step: float = 0.25  # the direction protocol's step length
    adam_learning_rate: float = 0.05  # the adam protocol's step size

    def step_size(self, protocol: str) -> float:
        """The learning rate (or step length) of ``protocol``."""
        return {"normalised": self.learning_rate, "direction": self.direction_step,
                "adam": self.adam_learning_rate}[protocol]

    @classmethod
    def quick(cls) -> "Settings":
        return cls(seeds=2, groups=40, bias_groups=200, learning_seeds=2, steps=6, groups_per_step=4)


@dataclass(frozen=True)
class Row:
    """One estimator in one regime."""

    regime: str
    estimator: str
    cosine: Interval
    group_cosines: torch.Tensor  # [seeds * groups], the same groups for every estimator of a regime
    nmse: float
    bias: Bias
    token_correlation: Interval
    final_rewards: dict[str, torch.Tensor]  # per protocol, [learning_seeds] J at the end of each seed's curve
    start_reward: float
    fire_rate: float
    fired_group_size: float
    curves: dict[str, list[float]]  # per protocol, mean over seeds

    @property
    def final_reward(self) -> dict[str, Interval]:
        """Per protocol, the mean final J with its Student-t 95% CI over the learning seeds."""
        return {protocol: student_interval(finals) for protocol, finals in self.final_rewards.items()}


@dataclass(frozen=True)
class _Samples:
    """What every estimator of a regime is measured on."""

    environments: list[Environment]
    groups: list[Groups]
    bias_environment: Environment
    bias_groups: Groups
    fire_rate: float
    fired_group_size: float


def run_sweep(settings: Settings, chosen: list[Regime] | None = None,
              estimators: list[str | EstimatorChoice] | None = None) -> list[Row]:
    """Every estimator (default: every registered one and the oracle; or ``estimators``:
    names, or choices with parameters, each a row labelled as the choice) in every
    regime, on the same sampled groups per seed."""
    names = estimators or estimator_names()
    rows = []
    progress = tqdm(total=len(chosen or regimes()) * len(names), desc="credit benchmark", unit="estimator×regime")
    for regime in chosen or regimes():
        samples = _sample(regime, settings)
        for name in names:
            interrupt_point()  # Ctrl-C stops between estimators
            rows.append(_run_one(regime, name, settings, samples))
            progress.update()
    progress.close()
    return rows


def _sample(regime: Regime, settings: Settings) -> _Samples:
    environments = [Environment.build(regime, seed) for seed in range(settings.seeds)]
    groups = [sample_groups(env, settings.groups, torch.Generator().manual_seed(seed))
              for seed, env in enumerate(environments)]
    rates, sizes = [], []
    for env, sampled in zip(environments, groups):
        results = advantages_of("leaf", env, sampled)[1]
        rate, size = forkability(sum((r.nodes for r in results), []), sum((r.boundaries for r in results), []))
        rates.append(rate)
        sizes.append(size)
    bias_environment = Environment.build(regime, 1000)
    bias_groups = sample_groups(bias_environment, settings.bias_groups, torch.Generator().manual_seed(1000))
    return _Samples(environments, groups, bias_environment, bias_groups, _mean(rates), _mean(sizes))


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def _run_one(regime: Regime, name: str | EstimatorChoice, settings: Settings, samples: _Samples) -> Row:
    measures: list[CreditMeasures] = []
    for env, groups in zip(samples.environments, samples.groups):
        advantages, _ = advantages_of(name, env, groups)
        measures.append(measure_credit(env, groups, advantages))
    bias_advantages, _ = advantages_of(name, samples.bias_environment, samples.bias_groups)
    bias = gradient_bias(samples.bias_environment, samples.bias_groups, bias_advantages)
    curves = {
        protocol: torch.stack([
            learning_curve(regime, name, seed, settings.steps, settings.groups_per_step, settings.step_size(protocol),
                           protocol)
            for seed in range(settings.learning_seeds)
        ])  # [S, steps+1]
        for protocol in PROTOCOLS
    }
    return Row(
        regime=regime.name,
        estimator=name.label if isinstance(name, EstimatorChoice) else name,
        cosine=_pooled([m.cosine for m in measures]),
        group_cosines=torch.cat([m.group_cosines for m in measures]),
        nmse=sum(m.nmse for m in measures) / len(measures),
        bias=bias,
        token_correlation=_pooled([m.token_correlation for m in measures]),
        final_rewards={protocol: curve[:, -1] for protocol, curve in curves.items()},
        start_reward=float(curves[PROTOCOLS[0]][:, 0].mean()),
        fire_rate=samples.fire_rate,
        fired_group_size=samples.fired_group_size,
        curves={protocol: curve.mean(dim=0).tolist() for protocol, curve in curves.items()},
    )


def _pooled(parts: list[Interval]) -> Interval:
    """Combine per-seed intervals of equal-sized samples (mean of means, pooled error)."""
    total = sum(p.count for p in parts)
    if total == 0:
        return Interval(float("nan"), float("nan"), 0)
    mean = sum(p.mean * p.count for p in parts if p.count) / total
    half = (sum((p.half_width**2) * (p.count**2) for p in parts if p.count) ** 0.5) / total
    return Interval(mean, half, total)


def paired_cosine_gain(rows: list[Row], row: Row, baseline: str = "grpo") -> Interval | None:
    """Per-group cosine minus the baseline's on the very same groups (mean, 95% CI); None
    for the baseline itself or where it was not run."""
    other = _baseline_row(rows, row, baseline)
    return None if other is None else interval(row.group_cosines - other.group_cosines)


def paired_learning_gain(rows: list[Row], row: Row, protocol: str, baseline: str = "grpo") -> Interval | None:
    """Final J minus the baseline's, seed by seed (seed ``s`` starts both from the same
    environment and the same first groups), mean with its Student-t 95% CI over the
    seeds; None for the baseline itself or where it was not run. Pairing removes the
    spread between environments, which dominates the unpaired intervals."""
    other = _baseline_row(rows, row, baseline)
    return None if other is None else student_interval(row.final_rewards[protocol] - other.final_rewards[protocol])


def _baseline_row(rows: list[Row], row: Row, baseline: str) -> Row | None:
    """The ``baseline`` estimator's row of ``row``'s regime; None where it was not run or
    is ``row`` itself (nothing to pair with)."""
    other = next((r for r in rows if r.regime == row.regime and r.estimator == baseline), None)
    return None if other is row else other


def _gain_text(rows: list[Row], row: Row, baseline: str) -> str:
    gain = paired_cosine_gain(rows, row, baseline)
    if gain is None:
        return "–"
    return f"{gain.mean:+.4f} ± {gain.half_width:.4f}"


def _learning_gain_text(rows: list[Row], row: Row) -> str:
    gains = [paired_learning_gain(rows, row, protocol) for protocol in PROTOCOLS]
    if any(gain is None for gain in gains):
        return "–"
    return " / ".join(f"{gain.mean:+.3f} ± {gain.half_width:.3f}" for gain in gains)


def markdown_table(rows: list[Row]) -> str:
    """The results table; the best value of each regime's gradient cosine is in bold
    (the oracle excluded)."""
    lines = [
        "| regime | estimator | grad cosine (95% CI) | − grpo, paired | − otb, paired | NMSE (best scale) "
        "| cos(mean grad) | projection | direction bias (excess) | token corr. | J after learning, normalised | J, direction "
        "| J, adam | J − grpo, paired (normalised / direction / adam) | LEAF fire rate |",
        "|---|---|---|---|---|---:|---|---|---:|---|---|---|---|---|---:|",
    ]
    for regime in dict.fromkeys(row.regime for row in rows):
        members = [row for row in rows if row.regime == regime]
        contenders = [row for row in members if row.estimator != ORACLE]
        best = max(contenders, key=lambda row: row.cosine.mean).estimator if contenders else None
        for row in members:
            cosine = f"**{row.cosine:.4f}**" if row.estimator == best else f"{row.cosine:.4f}"
            final = [f"{row.final_reward[p]} (from {row.start_reward:.3f})" if i == 0 else str(row.final_reward[p])
                     for i, p in enumerate(PROTOCOLS)]
            lines.append(
                f"| {row.regime} | {row.estimator} | {cosine} | {_gain_text(rows, row, 'grpo')} "
                f"| {_gain_text(rows, row, 'otb')} | {row.nmse:.3f} | {row.bias.cosine:.4f} | {row.bias.projection} "
                f"| {row.bias.excess:.1f} "
                f"| {row.token_correlation} | {' | '.join(final)} | {_learning_gain_text(rows, row)} "
                f"| {row.fire_rate:.2f} |"
            )
    return "\n".join(lines)


def write_csv(rows: list[Row], path: Path) -> None:
    """The table as CSV (one row per regime and estimator, CI half-widths as columns)."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["regime", "estimator", "cosine", "cosine_ci",
                         "cosine_minus_grpo", "cosine_minus_grpo_ci", "cosine_minus_otb", "cosine_minus_otb_ci",
                         "nmse", "mean_gradient_cosine", "mean_gradient_cosine_ci", "projection", "projection_ci", "direction_bias_excess",
                         "token_correlation", "token_correlation_ci",
                         *[f"final_reward_{p}" for p in PROTOCOLS], *[f"final_reward_{p}_ci" for p in PROTOCOLS],
                         *[f"final_reward_{p}_minus_grpo{part}" for p in PROTOCOLS for part in ("", "_ci")],
                         "start_reward", "fire_rate", "fired_group_size"])
        nothing = Interval(float("nan"), float("nan"), 0)
        for row in rows:
            gains = [paired_cosine_gain(rows, row, baseline) or nothing for baseline in BASELINES]
            learned = [paired_learning_gain(rows, row, protocol) or nothing for protocol in PROTOCOLS]
            writer.writerow([row.regime, row.estimator, row.cosine.mean, row.cosine.half_width,
                             gains[0].mean, gains[0].half_width, gains[1].mean, gains[1].half_width, row.nmse,
                             row.bias.cosine.mean, row.bias.cosine.half_width,
                             row.bias.projection.mean, row.bias.projection.half_width, row.bias.excess,
                             row.token_correlation.mean, row.token_correlation.half_width,
                             *[row.final_reward[p].mean for p in PROTOCOLS],
                             *[row.final_reward[p].half_width for p in PROTOCOLS],
                             *[value for gain in learned for value in (gain.mean, gain.half_width)],
                             row.start_reward, row.fire_rate, row.fired_group_size])
