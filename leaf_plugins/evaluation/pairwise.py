"""Pairwise A/B judging with position-swap consistency (the paper's JudgeLM protocol).

Every pair (answer X, answer Y) is judged twice: once with X shown first ("A" /
"Assistant 1") and once with Y first. Each judge output is parsed into a verdict for the
first shown answer, the second, a tie, or "unparseable"; verdicts are mapped back to X
and Y. A pair counts as decided only when both orders parse and agree.

Accepted judge output formats (``parse_verdict``):

* ``judgelm``: the first non-empty line holds two numbers, the scores of the first and
  second shown answer (``"8 6"``, ``"7.5, 9"``); higher wins, equal scores are a tie.
* ``prometheus``: relative grading ending in ``[RESULT] A`` or ``[RESULT] B`` (the last
  ``[RESULT]`` counts; ``[RESULT] TIE`` / ``C`` is read as a tie).
* ``auto`` (default): ``prometheus`` when the text contains ``[RESULT]``, else ``judgelm``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import torch

from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.evaluation.tail_risk import CHUNK_ELEMENTS, BOOTSTRAP_RESAMPLES, Estimate

__all__ = [
    "FIRST",
    "SECOND",
    "TIE",
    "UNPARSEABLE",
    "FORMATS",
    "OUTCOMES",
    "parse_verdict",
    "pair_outcomes",
    "PairwiseSummary",
    "summarize_pairs",
]

FIRST, SECOND, TIE, UNPARSEABLE = "first", "second", "tie", "unparseable"
FORMATS = ("auto", "judgelm", "prometheus")

# outcome codes of a pair, from X's point of view
X_WINS, Y_WINS, TIED, INCONSISTENT, UNPARSED = 0, 1, 2, 3, 4
OUTCOMES = ("x_wins", "y_wins", "tie", "inconsistent", "unparseable")

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_SCORE_LINE = re.compile(rf"^\s*({_NUMBER})\s*(?:[,;/]|\s)\s*({_NUMBER})\b")
_RESULT = re.compile(r"\[RESULT\]\s*\(?\s*([A-Za-z]+)", re.IGNORECASE)


def parse_verdict(text: str, format: str = "auto") -> str:
    """The verdict of one judge output: ``first``, ``second``, ``tie`` or ``unparseable``
    (first/second = the answer shown first/second). See the module doc for formats."""
    if format not in FORMATS:
        raise ConfigError(f"unknown judge output format {format!r}.{suggest(format, FORMATS)} "
                          f"Formats: {', '.join(FORMATS)}")
    if format == "prometheus" or (format == "auto" and "[RESULT]" in text.upper()):
        found = _RESULT.findall(text)
        if not found:
            return UNPARSEABLE
        label = found[-1].upper()
        return {"A": FIRST, "B": SECOND, "TIE": TIE, "C": TIE}.get(label, UNPARSEABLE)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return UNPARSEABLE
    match = _SCORE_LINE.match(lines[0])
    if not match:
        return UNPARSEABLE
    first, second = float(match.group(1)), float(match.group(2))
    return FIRST if first > second else SECOND if second > first else TIE


def pair_outcomes(x_first: Sequence[str], y_first: Sequence[str], format: str = "auto") -> torch.Tensor:
    """Outcome code per pair ``[n]`` int64 from the two orders' raw judge outputs.

    :param x_first: judge output with X shown first, one per pair.
    :param y_first: judge output with Y shown first (the swapped order).
    :return: codes ``0`` X wins, ``1`` Y wins, ``2`` tie (both orders agree), ``3``
        inconsistent (both parse, they disagree), ``4`` unparseable (either order).
    """
    if len(x_first) != len(y_first):
        raise ValueError(f"{len(x_first)} outputs in the X-first order but {len(y_first)} in the swapped order")
    to_x = {FIRST: "x", SECOND: "y", TIE: "tie"}
    swapped = {FIRST: "y", SECOND: "x", TIE: "tie"}
    codes = []
    for straight, reverse in zip(x_first, y_first):
        one, two = parse_verdict(straight, format), parse_verdict(reverse, format)
        if UNPARSEABLE in (one, two):
            codes.append(UNPARSED)
        elif to_x[one] != swapped[two]:
            codes.append(INCONSISTENT)
        else:
            codes.append({"x": X_WINS, "y": Y_WINS, "tie": TIED}[to_x[one]])
    return torch.tensor(codes, dtype=torch.int64)


@dataclass(frozen=True)
class PairwiseSummary:
    """Rates over all N pairs (fractions in [0, 1]) with bootstrap 95% CIs.

    ``x_win + y_win + tie = consistency``; ``consistency + inconsistent + unparseable = 1``.
    ``net_advantage = x_win - y_win`` over all N pairs (the paper's "net adv.", its
    Table ``tab:pairwise``); ``decided_x_win = wins / (wins + losses)`` (its "L. win
    decided"); ``net_advantage_decided = (wins - losses) / (wins + losses)``. The decided
    rates are NaN when no pair is decided.
    """

    pairs: int
    counts: dict[str, int]
    x_win: Estimate
    y_win: Estimate
    tie: Estimate
    consistency: Estimate
    unparseable: Estimate
    net_advantage: Estimate
    decided_x_win: Estimate
    net_advantage_decided: Estimate

    def rows(self, x_name: str = "X", y_name: str = "Y") -> list[tuple[str, str]]:
        """(label, "value [low, high]") rows in percent / percentage points."""
        labels = (
            (f"win {x_name} (%)", self.x_win), (f"win {y_name} (%)", self.y_win), ("tie (%)", self.tie),
            ("consistent (%)", self.consistency), ("unparseable (%)", self.unparseable),
            ("net adv. (pp)", self.net_advantage), (f"{x_name} win of decided (%)", self.decided_x_win),
            ("net adv. of decided (pp)", self.net_advantage_decided),
        )
        return [(label, str(estimate.scaled(100))) for label, estimate in labels]


def _rates(codes: torch.Tensor) -> torch.Tensor:
    """``[R, n]`` outcome codes → ``[R, 8]`` statistics in ``PairwiseSummary`` order."""
    counts = torch.stack([(codes == c).sum(dim=1) for c in range(len(OUTCOMES))], dim=1).to(torch.float64)  # [R, 5]
    n = codes.shape[1]
    wins, losses, ties = counts[:, X_WINS], counts[:, Y_WINS], counts[:, TIED]
    decided = wins + losses
    nan = torch.full_like(wins, float("nan"))
    return torch.stack([
        wins / n, losses / n, ties / n, (wins + losses + ties) / n, counts[:, UNPARSED] / n,
        (wins - losses) / n,
        torch.where(decided > 0, wins / decided.clamp(min=1), nan),
        torch.where(decided > 0, (wins - losses) / decided.clamp(min=1), nan),
    ], dim=1)


def summarize_pairs(
    codes: torch.Tensor, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95, seed: int = 0
) -> PairwiseSummary:
    """Win/tie rates, consistency and net advantage of pair outcome ``codes [n]`` (from
    ``pair_outcomes``), with percentile bootstrap CIs over pairs (``resamples``, seeded,
    all resamples at once; resamples with no decided pair are left out of the decided
    rates' intervals)."""
    codes = torch.as_tensor(codes, dtype=torch.int64)
    if codes.dim() != 1 or codes.numel() == 0:
        raise ValueError(f"codes must be a non-empty [n] tensor, got shape {tuple(codes.shape)}")
    if int(codes.min()) < 0 or int(codes.max()) >= len(OUTCOMES):
        raise ValueError(f"outcome codes must lie in 0..{len(OUTCOMES) - 1} ({', '.join(OUTCOMES)})")
    n = codes.numel()
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, CHUNK_ELEMENTS // n)
    point = _rates(codes.unsqueeze(0))[0]  # [8]
    replicates = torch.cat([
        _rates(codes[torch.randint(n, (min(chunk, resamples - start), n), generator=generator)])  # [rows, 8]
        for start in range(0, resamples, chunk)
    ])  # [R, 8]
    tail = (1.0 - level) / 2
    estimates = []
    for column in range(point.numel()):
        values = replicates[:, column]
        values = values[~torch.isnan(values)]
        if values.numel() == 0:
            estimates.append(Estimate(float("nan"), float("nan"), float("nan"), level))
            continue
        low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
        estimates.append(Estimate(float(point[column]), low, high, level))
    counts = {name: int((codes == code).sum()) for code, name in enumerate(OUTCOMES)}
    return PairwiseSummary(n, counts, *estimates)
