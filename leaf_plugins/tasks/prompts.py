"""The paper's prompt templates (Appendix "Prompt templates"), chosen per example from a
stable hash of its id, and the hash itself."""

from __future__ import annotations

import hashlib

__all__ = [
    "AUDIO", "SOUND", "LIBRISQA_TEMPLATES", "COVOST2_TEMPLATES", "LONGAUDIO_TEMPLATES",
    "stable_fraction", "pick_template", "qa_prompt", "translation_prompt", "longaudio_prompt",
]

AUDIO = "<|audio|>"
SOUND = "<sound>"  # the LongAudio placeholder

LIBRISQA_TEMPLATES = (
    "Listen to the audio <|audio|> and answer the following question: {question}",
    "<|audio|> Please answer this question about the spoken passage: {question}",
    "You will hear speech in <|audio|>. Answer: {question}",
)
COVOST2_TEMPLATES = (
    "<|audio|> Listen to the speech and translate it into German.",
    "Translate the audio <|audio|> from English to German.",
    "You will hear English speech in <|audio|>. Provide the German translation.",
)
LONGAUDIO_TEMPLATES = (
    "<|audio|>\n{question}",
    "{question}\n<|audio|>",
)


def stable_fraction(key: str) -> float:
    """A number in [0, 1) from the SHA-256 of ``key``: the same on every machine and run
    (unlike Python's salted ``hash()``)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def pick_template(templates: tuple[str, ...], key: str) -> str:
    """One of ``templates``, chosen by the stable hash of ``key``."""
    return templates[int(stable_fraction(key) * len(templates))]


def qa_prompt(example_id: str, question: str) -> str:
    """A LibriSQA-style prompt for ``question``."""
    return pick_template(LIBRISQA_TEMPLATES, example_id).replace("{question}", question.strip())


def translation_prompt(example_id: str) -> str:
    """A CoVoST2 English-to-German prompt."""
    return pick_template(COVOST2_TEMPLATES, example_id)


def longaudio_prompt(example_id: str, human: str) -> tuple[str, str]:
    """``(prompt, question)`` from a LongAudio human turn. A turn that holds ``<sound>``
    keeps its own layout (``<sound>`` becomes ``<|audio|>``: the prompt is inherited from the
    dataset); a turn without it gets one of the two variants, chosen from the id."""
    question = human.replace(SOUND, "").strip()
    if SOUND in human:
        return human.replace(SOUND, AUDIO).strip(), question
    return pick_template(LONGAUDIO_TEMPLATES, example_id).replace("{question}", question), question
