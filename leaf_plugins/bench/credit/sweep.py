"""The regimes of the benchmark, running them, and the results table."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from leaf_plugins.bench.credit.environment import Environment, Regime
from leaf_plugins.bench.credit.estimators import ORACLE, advantages_of, estimator_names
from leaf_plugins.bench.credit.learning import learning_curve
from leaf_plugins.bench.credit.measures import CreditMeasures, Interval, forkability, interval, measure_credit
from leaf_plugins.bench.credit.sampling import sample_groups

__all__ = ["Settings", "Row", "regimes", "run_sweep", "paired_cosine_gain", "markdown_table", "write_csv"]

BASE = Regime()


def regimes() -> list[Regime]:
    """The base setting and one change of one knob at a time."""
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
    ]


@dataclass(frozen=True)
class Settings:
    """How much work one run does (``quick`` for tests)."""

    seeds: int = 3
    groups: int = 200  # groups per seed for the gradient and credit measures
    steps: int = 40  # policy-gradient steps of the learning curves
    groups_per_step: int = 4
    learning_rate: float = 0.1

    @classmethod
    def quick(cls) -> "Settings":
        return cls(seeds=2, groups=40, steps=8, groups_per_step=2)


@dataclass(frozen=True)
class Row:
    """One estimator in one regime."""

    regime: str
    estimator: str
    cosine: Interval
    group_cosines: torch.Tensor  # [seeds * groups], the same groups for every estimator of a regime
    nmse: float
    mean_gradient_cosine: float
    token_correlation: Interval
    final_reward: Interval
    start_reward: float
    fire_rate: float
    fired_group_size: float
    curve: list[float]


def run_sweep(settings: Settings, chosen: list[Regime] | None = None, estimators: list[str] | None = None) -> list[Row]:
    """Every estimator in every regime, on the same sampled groups per seed."""
    names = estimators or estimator_names()
    rows = []
    work = [(regime, name) for regime in (chosen or regimes()) for name in names]
    for regime, name in tqdm(work, desc="credit benchmark", unit="estimator×regime"):
        rows.append(_run_one(regime, name, settings))
    return rows


def _run_one(regime: Regime, name: str, settings: Settings) -> Row:
    measures: list[CreditMeasures] = []
    fire_rates, group_sizes = [], []
    for seed in range(settings.seeds):
        env = Environment.build(regime, seed)
        groups = sample_groups(env, settings.groups, torch.Generator().manual_seed(seed))  # same groups for all
        advantages, _ = advantages_of(name, env, groups)
        measures.append(measure_credit(env, groups, advantages))
        leaf_result = advantages_of("leaf", env, groups)[1]
        rate, size = forkability(leaf_result.nodes, leaf_result.boundaries)
        fire_rates.append(rate)
        group_sizes.append(size)
    curves = torch.stack([
        learning_curve(regime, name, seed, settings.steps, settings.groups_per_step, settings.learning_rate)
        for seed in range(settings.seeds)
    ])  # [S, steps+1]
    return Row(
        regime=regime.name,
        estimator=name,
        cosine=_pooled([m.cosine for m in measures]),
        group_cosines=torch.cat([m.group_cosines for m in measures]),
        nmse=sum(m.nmse for m in measures) / len(measures),
        mean_gradient_cosine=sum(m.mean_gradient_cosine for m in measures) / len(measures),
        token_correlation=_pooled([m.token_correlation for m in measures]),
        final_reward=interval(curves[:, -1]),
        start_reward=float(curves[:, 0].mean()),
        fire_rate=sum(fire_rates) / len(fire_rates),
        fired_group_size=sum(group_sizes) / len(group_sizes),
        curve=curves.mean(dim=0).tolist(),
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
    """Per-group cosine minus the baseline's on the very same groups (mean, 95% CI)."""
    other = next((r for r in rows if r.regime == row.regime and r.estimator == baseline), None)
    if other is None:
        return None
    return interval(row.group_cosines - other.group_cosines)


def markdown_table(rows: list[Row]) -> str:
    """The results table; the best value of each regime's gradient cosine is in bold
    (the oracle excluded)."""
    lines = [
        "| regime | estimator | grad cosine (95% CI) | − grpo, paired (95% CI) | NMSE (best scale) | cos(mean grad) "
        "| token corr. (95% CI) | reward after learning (95% CI) | LEAF fire rate | fired group size |",
        "|---|---|---|---|---:|---:|---|---|---:|---:|",
    ]
    for regime in dict.fromkeys(row.regime for row in rows):
        members = [row for row in rows if row.regime == regime]
        contenders = [row for row in members if row.estimator != ORACLE]
        best = max(contenders, key=lambda row: row.cosine.mean).estimator if contenders else None
        for row in members:
            cosine = f"**{row.cosine}**" if row.estimator == best else str(row.cosine)
            gain = paired_cosine_gain(rows, row)
            gain_text = "–" if gain is None or row.estimator == "grpo" else f"{gain.mean:+.3f} ± {gain.half_width:.3f}"
            lines.append(
                f"| {row.regime} | {row.estimator} | {cosine} | {gain_text} | {row.nmse:.3f} | {row.mean_gradient_cosine:.3f} "
                f"| {row.token_correlation} | {row.final_reward} (from {row.start_reward:.3f}) "
                f"| {row.fire_rate:.2f} | {row.fired_group_size:.1f} |"
            )
    return "\n".join(lines)


def write_csv(rows: list[Row], path: Path) -> None:
    """The table as CSV (one row per regime and estimator, CI bounds as columns)."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["regime", "estimator", "cosine", "cosine_ci", "cosine_minus_grpo", "cosine_minus_grpo_ci",
                         "nmse", "mean_gradient_cosine",
                         "token_correlation", "token_correlation_ci", "final_reward", "final_reward_ci",
                         "start_reward", "fire_rate", "fired_group_size"])
        for row in rows:
            gain = paired_cosine_gain(rows, row) or Interval(float("nan"), float("nan"), 0)
            writer.writerow([row.regime, row.estimator, row.cosine.mean, row.cosine.half_width, gain.mean,
                             gain.half_width, row.nmse,
                             row.mean_gradient_cosine, row.token_correlation.mean, row.token_correlation.half_width,
                             row.final_reward.mean, row.final_reward.half_width, row.start_reward, row.fire_rate,
                             row.fired_group_size])
