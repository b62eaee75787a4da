"""The paper's filters: long-form clips of at most 40 s, no multiple-choice items."""

from __future__ import annotations

__all__ = ["MULTIPLE_CHOICE_MARKERS", "LONG_FORM_MAX_SECONDS", "is_multiple_choice"]

MULTIPLE_CHOICE_MARKERS = ("choose the correct option", "choose the correct answer")
LONG_FORM_MAX_SECONDS = 40.0


def is_multiple_choice(question: str, answer: str) -> bool:
    """True for a multiple-choice item: the question says "Choose the correct option" or
    "Choose the correct answer" (any case), or the answer starts with "(" (an option label)."""
    lowered = question.lower()
    return any(marker in lowered for marker in MULTIPLE_CHOICE_MARKERS) or answer.lstrip().startswith("(")
