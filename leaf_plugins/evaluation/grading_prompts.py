"""The prompts of the two absolute judges of the paper (Appendix "LLM-as-judge protocols").

* **GEMBA-DA 0–100** (Kocmi & Federmann 2023, "Large Language Models Are State-of-the-Art
  Evaluators of Translation Quality"): the reference-based direct-assessment prompt for
  translation, and the same prompt worded for question answering ("GEMBA-style", as the
  paper applies it to its QA tasks). The paper judges with Qwen2.5-14B-Instruct, N = 5
  samples at temperature 0.7, and averages them per item.
* **Likert 1–5** (Prometheus absolute grading, Kim et al. 2024; ``prometheus-eval``'s
  prompt with a reference answer and its system prompt): question, response, reference
  answer and a task rubric (QA: correctness, groundedness, completeness, hallucination;
  translation: accuracy, fluency, style), answered ``(feedback) [RESULT] n``. The paper
  judges with Unbabel/M-Prometheus-14B, greedy.

The paper names the protocols but does not print its prompt text; these are the published
prompts of both protocols, and docs/evaluation.md shows them in full.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from leaf_plugins.core.errors import ConfigError, suggest

__all__ = [
    "KINDS",
    "GradeItem",
    "DA_TRANSLATION",
    "DA_QA",
    "LIKERT_PROMPT",
    "LIKERT_SYSTEM",
    "RUBRICS",
    "clean_question",
    "da_prompt",
    "likert_prompt",
    "check_kind",
]

KINDS = ("qa", "translation")
"""Task kinds a prompt is worded for."""


@dataclass(frozen=True)
class GradeItem:
    """One item to grade: its id, the question (task prompt), the reference and the
    candidate answer; ``source`` is the source text of a translation when there is one
    (for speech translation the source is audio, which a text judge cannot read)."""

    id: str
    question: str
    reference: str
    candidate: str
    source: str | None = None


DA_TRANSLATION = (
    'Score the following translation from {source_lang} to {target_lang} with respect to the human reference on a '
    'continuous scale from 0 to 100, where score of zero means "no meaning preserved" and score of one hundred means '
    '"perfect meaning and grammar".\n\n'
    '{source_line}'
    '{target_lang} human reference: {reference}\n'
    '{target_lang} translation: "{candidate}"\n'
    'Score: '
)
"""GEMBA-DA with a human reference; ``{source_line}`` is ``{source_lang} source: "{source}"``
and a newline when the item has a source text, else empty."""

DA_QA = (
    'Score the following answer to a question about an audio recording with respect to the reference answer on a '
    'continuous scale from 0 to 100, where score of zero means "wrong or unrelated answer" and score of one hundred '
    'means "fully correct and complete answer".\n\n'
    'Question: "{question}"\n'
    'Reference answer: {reference}\n'
    'Answer: "{candidate}"\n'
    'Score: '
)
"""GEMBA-DA worded for question answering (the paper's "GEMBA-style" DA on QA tasks)."""

LIKERT_SYSTEM = ("You are a fair judge assistant tasked with providing clear, objective feedback based on specific "
                 "criteria, ensuring each assessment reflects the absolute standards set for performance.")
"""Prometheus' absolute-grading system prompt (sent as a system turn when the judge has a chat template)."""

LIKERT_PROMPT = (
    "###Task Description:\n"
    "An instruction (might include an Input inside it), a response to evaluate, a reference answer that gets a score "
    "of 5, and a score rubric representing a evaluation criteria are given.\n"
    "1. Write a detailed feedback that assess the quality of the response strictly based on the given score rubric, "
    "not evaluating in general.\n"
    "2. After writing a feedback, write a score that is an integer between 1 and 5. You should refer to the score "
    "rubric.\n"
    '3. The output format should look as follows: "(write a feedback for criteria) [RESULT] (an integer number '
    'between 1 and 5)"\n'
    "4. Please do not generate any other opening, closing, and explanations.\n\n"
    "###The instruction to evaluate:\n{question}\n\n"
    "###Response to evaluate:\n{candidate}\n\n"
    "###Reference Answer (Score 5):\n{reference}\n\n"
    "###Score Rubrics:\n{rubric}\n\n"
    "###Feedback: "
)
"""Prometheus absolute grading with a reference answer."""

RUBRICS = {
    "qa": (
        "[Is the response correct, grounded in the content of the audio (as given by the reference answer), "
        "complete, and free of hallucinated information?]\n"
        "Score 1: The response is wrong or unrelated to the question, or consists mostly of hallucinated content "
        "that contradicts the reference answer.\n"
        "Score 2: The response addresses the question but is mostly incorrect: it contradicts the reference answer "
        "in important points or adds substantial unsupported information.\n"
        "Score 3: The response is partially correct: it gives some of the reference answer's content but misses key "
        "information or contains some unsupported claims.\n"
        "Score 4: The response is correct and grounded, with minor omissions or minor unsupported details.\n"
        "Score 5: The response is fully correct, as complete as the reference answer, and contains no hallucinated "
        "information."
    ),
    "translation": (
        "[Is the translation accurate (it conveys the meaning of the reference translation), fluent in the target "
        "language, and appropriate in style?]\n"
        "Score 1: The translation does not convey the meaning of the reference: it is wrong, unrelated, in the "
        "wrong language, or unreadable.\n"
        "Score 2: The translation conveys only fragments of the meaning, with major errors, omissions or additions, "
        "and is hard to read.\n"
        "Score 3: The translation conveys the main meaning but has clear errors of accuracy or fluency, or an "
        "unnatural style.\n"
        "Score 4: The translation is accurate and fluent, with minor errors of wording, grammar or style.\n"
        "Score 5: The translation conveys the full meaning of the reference, is fluent and natural, and matches "
        "its style."
    ),
}
"""The task rubrics of the Likert judge, in Prometheus' ``[criteria]`` / ``Score n:`` layout."""

_AUDIO = re.compile(r"<\|audio_bos\|>\s*<\|AUDIO\|>\s*<\|audio_eos\|>|<\|audio\|>|<sound>")


def check_kind(kind: str) -> str:
    """``kind`` itself when it is one of ``KINDS``; else a ``ConfigError`` with a did-you-mean."""
    if kind not in KINDS:
        raise ConfigError(f"unknown task kind {kind!r}.{suggest(kind, KINDS)} Kinds: {', '.join(KINDS)}")
    return kind


def clean_question(question: str) -> str:
    """The task prompt as a text judge reads it: audio placeholders (``<|audio|>``,
    Qwen2-Audio's ``<|audio_bos|><|AUDIO|><|audio_eos|>``, ``<sound>``) become ``[audio]``."""
    return _AUDIO.sub("[audio]", question).strip()


def da_prompt(item: GradeItem, kind: str = "qa", source_lang: str = "English", target_lang: str = "German") -> str:
    """The GEMBA-DA prompt of ``item`` (``kind``: ``qa`` or ``translation``)."""
    if check_kind(kind) == "qa":
        return DA_QA.format(question=clean_question(item.question), reference=item.reference,
                            candidate=item.candidate)
    source_line = f'{source_lang} source: "{item.source}"\n' if item.source is not None else ""
    return DA_TRANSLATION.format(source_lang=source_lang, target_lang=target_lang, source_line=source_line,
                                 reference=item.reference, candidate=item.candidate)


def likert_prompt(item: GradeItem, kind: str = "qa", rubric: str | None = None) -> str:
    """The Prometheus absolute-grading prompt of ``item`` with the rubric of ``kind`` (or
    ``rubric``, in the ``[criteria]`` / ``Score 1:`` … ``Score 5:`` layout)."""
    return LIKERT_PROMPT.format(question=clean_question(item.question), candidate=item.candidate,
                                reference=item.reference, rubric=rubric or RUBRICS[check_kind(kind)])
