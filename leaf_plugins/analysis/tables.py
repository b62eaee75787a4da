"""Markdown and CSV tables of forkability summaries and per-position rows."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

__all__ = ["summary_markdown", "write_csv"]


def _percent(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.1f}"


def _plain(value: object, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_markdown(rows: Sequence[dict], tau: float) -> str:
    """The per-cell table (paper Tables tab:fork-percell-app, tab:fork-aux-app and
    tab:fork-decay-app in one): rates in %, CIs in parentheses."""
    header = ("| Rollouts | Groups | Selected | Fired | Usable | fire rate (%) | r_f (%, per-position bootstrap CI) "
              "| r_f Wilson CI | Group size | Reward spread | MU pos | P50 | P90 | P99 | Last | # pos |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['groups']} | {row['attempts']} | {row['fired']} | {row['usable']} "
            f"| {_percent(row['fire_rate'])} | {_percent(row['r_f'])} ({_percent(row['r_f_boot_low'])}"
            f"–{_percent(row['r_f_boot_high'])}) "
            f"| {_percent(row['r_f_wilson_low'])}–{_percent(row['r_f_wilson_high'])} "
            f"| {_plain(row['group_size'])} | {_plain(row['reward_spread'], 3)} | {_plain(row['mu_pos'], 1)} "
            f"| {_plain(row['p50'])} | {_plain(row['p90'])} | {_plain(row['p99'])} | {_plain(row['last'])} "
            f"| {_plain(row['n_pos'])} |"
        )
    lines.append("")
    lines.append(f"Usable: some prefix group of >= 2 responses has reward max - min > tau = {tau:g}. "
                 "Group size and reward spread (max - min) are means over fired prefix groups; "
                 "MU pos is the mean position of usable fires; P_q the position by which q% of usable fires occurred.")
    return "\n".join(lines)


def write_csv(rows: Sequence[dict], columns: Sequence[str], path: str | Path) -> Path:
    """Rows (dicts) as CSV with the given column order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key) for key in columns})
    return path
