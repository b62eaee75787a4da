"""Reading a score out of one absolute judge output; what does not parse says why.

* ``parse_da`` (GEMBA-DA, 0–100): a number after a ``Score`` label (``Score: 85``,
  ``**Score:** 85``, ``score of 85``); with no label, the one number in the text. A
  denominator (``85/100``, ``85 out of 100``) is not a second number. Decimals are kept
  (the scale is continuous). Several labelled or unlabelled numbers that differ are
  ambiguous.
* ``parse_likert`` (Prometheus, 1–5): the integer after the last ``[RESULT]`` marker
  (``[RESULT] 4``, ``[RESULT]: (4)``, ``[RESULT] 4/5``, ``[RESULT] 4 out of 5``).

An output that gives no score, a score outside the scale, an ambiguous one, or (Likert) a
non-integer is unparsable: its ``Parsed.score`` is None and ``Parsed.problem`` names the
reason (never read as 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Parsed", "NO_SCORE", "OUT_OF_RANGE", "AMBIGUOUS", "NOT_INTEGER", "PROBLEMS", "parse_da", "parse_likert"]

NO_SCORE, OUT_OF_RANGE, AMBIGUOUS, NOT_INTEGER = "no score", "out of range", "ambiguous", "not an integer"
PROBLEMS = (NO_SCORE, OUT_OF_RANGE, AMBIGUOUS, NOT_INTEGER)
"""Why an output did not parse, in report order."""

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_LABELLED = re.compile(rf"score\W{{0,3}}\s*(?:is|of|=|:)?\s*[*_\s]*({_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_RESULT = re.compile(r"\[RESULT\]", re.IGNORECASE)
_AFTER_RESULT = re.compile(rf"\s*[:\-]?\s*[(\[]?\s*({_NUMBER})")


@dataclass(frozen=True)
class Parsed:
    """A judge output's score, or None and the reason it did not parse."""

    score: float | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


def _numbers(text: str) -> list[float]:
    """Every number of ``text`` that is not a denominator (``/100``, ``out of 100``)."""
    found = []
    for match in _ANY_NUMBER.finditer(text):
        before = text[: match.start()]
        if re.search(r"(?:/|out\s+of)\s*$", before):
            continue
        found.append(float(match.group()))
    return found


def parse_da(text: str, low: float = 0.0, high: float = 100.0) -> Parsed:
    """The DA score of one GEMBA-DA output (see the module doc), within ``[low, high]``."""
    labelled = [float(match.group(1)) for match in _LABELLED.finditer(text)]
    values = labelled or _numbers(text)
    if not values:
        return Parsed(None, NO_SCORE)
    if len(set(values)) > 1:
        return Parsed(None, AMBIGUOUS)
    value = values[0]
    if not low <= value <= high:
        return Parsed(None, OUT_OF_RANGE)
    return Parsed(value)


def parse_likert(text: str, low: int = 1, high: int = 5) -> Parsed:
    """The Likert score after the last ``[RESULT]`` of one output, an integer in ``[low, high]``."""
    markers = list(_RESULT.finditer(text))
    if not markers:
        return Parsed(None, NO_SCORE)
    match = _AFTER_RESULT.match(text, markers[-1].end())
    if match is None:
        return Parsed(None, NO_SCORE)
    value = float(match.group(1))
    if not value.is_integer():
        return Parsed(None, NOT_INTEGER)
    if not low <= value <= high:
        return Parsed(None, OUT_OF_RANGE)
    return Parsed(value)
