"""Run a Hugging Face causal LM as a pairwise judge, both orders per pair, greedy.

``judge_pairs`` builds the prompt of every pair in both orders (X first, then Y first),
generates 2N greedy outputs in batches (``PAIRWISE_DECODING`` or the caller's
``JudgeDecoding``) with any ``AutoModelForCausalLM`` given by hub id or local path, and
hands the outputs to ``pairwise.pair_outcomes`` / ``summarize_pairs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.evaluation.judge_model import JudgeDecoding, load_judge
from leaf_plugins.evaluation.pairwise import PairwiseSummary, pair_outcomes, summarize_pairs

__all__ = ["PairItem", "JudgeRun", "TEMPLATES", "PAIRWISE_DECODING", "build_prompt", "judge_pairs"]


@dataclass(frozen=True)
class PairItem:
    """One A/B item: the question, its reference answer and the two answers compared."""

    question: str
    reference: str
    answer_x: str
    answer_y: str


JUDGELM_TEMPLATE = """You are a helpful and precise assistant for checking the quality of the answer.
[Question]
{question}

[Reference Answer]
{reference}

[The Start of Assistant 1's Answer]
{first}

[The End of Assistant 1's Answer]

[The Start of Assistant 2's Answer]
{second}

[The End of Assistant 2's Answer]

[System]
We would like to request your feedback on the performance of two AI assistants in response to the user question displayed above.
Please rate the helpfulness, relevance, accuracy and level of detail of their responses, using the reference answer. Each assistant receives an overall score on a scale of 1 to 10, where a higher score indicates better overall performance.
Please first output a single line containing only two values indicating the scores for Assistant 1 and 2, respectively. The two scores are separated by a space. In the subsequent line, please provide a comprehensive explanation of your evaluation, avoiding any potential bias and ensuring that the order in which the responses were presented does not affect your judgment.

### Response:"""

PROMETHEUS_TEMPLATE = """###Task Description:
An instruction, a reference answer, two responses to evaluate and a score rubric are given.
1. Write a detailed feedback that assesses the quality of the two responses strictly based on the score rubric.
2. After writing the feedback, choose the better response between Response A and Response B, referring to the rubric.
3. The output format should look as follows: "(feedback) [RESULT] (A or B)"
4. Please do not generate any other opening, closing, and explanations.

###Instruction:
{question}

###Response A:
{first}

###Response B:
{second}

###Reference Answer:
{reference}

###Score Rubric:
{rubric}

###Feedback: """

DEFAULT_RUBRIC = "Is the response accurate, fluent and faithful to the reference answer?"

TEMPLATES = {"judgelm": JUDGELM_TEMPLATE, "prometheus": PROMETHEUS_TEMPLATE}

PAIRWISE_DECODING = JudgeDecoding(samples=1, temperature=0.0, max_new_tokens=128, chat_template=False)
"""The pairwise judge's decoding: one greedy output per order, the template as a plain
prompt (both templates are completion prompts); ``dataclasses.replace`` it to change the
token budget, the batch size or the seed."""


def build_prompt(item: PairItem, x_first: bool, template: str = "judgelm", rubric: str = DEFAULT_RUBRIC) -> str:
    """The judge prompt of ``item`` with X shown first (``x_first``) or second."""
    if template not in TEMPLATES:
        raise ConfigError(f"unknown judge template {template!r}.{suggest(template, TEMPLATES)} "
                          f"Templates: {', '.join(TEMPLATES)}")
    first, second = (item.answer_x, item.answer_y) if x_first else (item.answer_y, item.answer_x)
    return TEMPLATES[template].format(question=item.question, reference=item.reference, first=first,
                                      second=second, rubric=rubric)


@dataclass(frozen=True)
class JudgeRun:
    """Raw judge outputs in both orders, the per-pair outcome codes and their summary."""

    prompts_x_first: list[str]
    prompts_y_first: list[str]
    outputs_x_first: list[str]
    outputs_y_first: list[str]
    codes: torch.Tensor  # [N] int64 outcome codes (pairwise.OUTCOMES)
    summary: PairwiseSummary


def judge_pairs(
    model_id_or_path: str,
    items: Sequence[PairItem],
    template: str = "judgelm",
    rubric: str = DEFAULT_RUBRIC,
    decoding: JudgeDecoding = PAIRWISE_DECODING,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> JudgeRun:
    """Judge every pair in both orders with a causal LM (one greedy output per order).

    :param model_id_or_path: a Hugging Face hub id or a local directory holding a model
        loadable by ``AutoModelForCausalLM`` and its tokenizer.
    :param items: the pairs; X and Y are the two systems compared (e.g. LEAF and GRPO).
    :param template: ``judgelm`` (two scores on the first line) or ``prometheus``
        (relative grading ending in ``[RESULT] A/B``); the parser follows the template.
    :param decoding: token budget, batch size, seed (also the summary's bootstrap seed),
        chat template; greedy with one sample, else a ``ConfigError``.
    :return: prompts and outputs of both orders, outcome codes and the summary.
    """
    if decoding.samples != 1 or decoding.temperature != 0:
        raise ConfigError(f"the pairwise judge decodes greedily, one output per order: got samples="
                          f"{decoding.samples}, temperature={decoding.temperature:g}; give samples=1, temperature=0")
    if not items:
        raise ValueError("no pairs to judge")
    prompts_x = [build_prompt(item, True, template, rubric) for item in items]
    prompts_y = [build_prompt(item, False, template, rubric) for item in items]
    judge = load_judge(model_id_or_path, device, dtype)
    outputs = [texts[0] for texts in judge.generate(prompts_x + prompts_y, decoding,
                                                    description="judging (both orders)")]
    outputs_x, outputs_y = outputs[: len(items)], outputs[len(items) :]
    codes = pair_outcomes(outputs_x, outputs_y, format=template)
    return JudgeRun(prompts_x, prompts_y, outputs_x, outputs_y, codes, summarize_pairs(codes, seed=decoding.seed))
