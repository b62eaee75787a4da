"""What the training-stage hooks (``rollout``, ``score_rollouts``, ``compute_loss``)
and the rollout backends receive and return: the step they run in, what to sample, the
sampled responses, and the loss.

These types live in core, beside the hook specifications that name them, so that a
plugin implementing a stage (a vLLM or SGLang rollout server, a custom loss) needs
nothing from the trainer, and core never imports ``leaf_plugins.training``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from leaf_plugins.core.batch import RolloutBatch

if TYPE_CHECKING:
    from leaf_plugins.core.backbone import LoadedBackbone
    from leaf_plugins.core.task import Example

__all__ = ["StepContext", "GROUP_ID_STRIDE", "RolloutRequest", "Rollout", "PolicyLoss"]


GROUP_ID_STRIDE = 1_000_000
"""Group ids of training step s are ``(s - 1) · GROUP_ID_STRIDE`` plus the prompt's
position in the step (round r of a step that samples several: plus r · prompts per step;
``StepContext.group_ids``)."""


@dataclass
class StepContext:
    """What the stage hooks of one step see."""

    step: int  # the training step, 1-based (as on_step_end, on_optimizer_step and metrics.jsonl number it)
    model: Any  # the PeftModel (unwrapped from DDP)
    loaded: "LoadedBackbone"
    examples: "list[Example]"  # this process's prompts of the step
    inputs: dict[str, torch.Tensor]  # their model inputs (left padded), with the prompts' ``inputs_embeds``
    config: Any  # the run's ``TrainConfig`` (``leaf_plugins.training.config``)
    first_prompt: int = 0  # the position of ``examples[0]`` in its round: this process's prompts are the round's
    # ``first_prompt … first_prompt + len(examples) - 1`` (0 on one process)
    sampling_round: int = 0  # the step's sampling round (rollout.dynamic_sampling samples rounds until enough
    # groups are informative; 0 without it)
    rewards: Any = None  # the run's configured rewards (training/rewards.py's RunRewards): a score_rollouts plugin
    # reads rewards.scores(rollout, examples) (each reward's [N] scores) and rewards.total(scores) (their weighted sum)

    @property
    def group_ids(self) -> list[int]:
        """The group id of each of ``examples``: unique in the run, the same on any number
        of processes (a rollout plugin gives its groups these ids; the built-in backends
        key each response's sampling with them)."""
        first = (self.step - 1) * GROUP_ID_STRIDE + self.sampling_round * self.config.rollout.prompts_per_step
        return [first + self.first_prompt + i for i in range(len(self.examples))]


@dataclass(frozen=True)
class RolloutRequest:
    """What a rollout backend samples: ``group_size`` responses for every prompt of
    ``inputs``, under these settings (``rollout.*`` of the run config in training; the
    defaults are the paper's). It travels unchanged from the trainer or the evaluation
    to the decode loop. Stable for plugin authors: fields may be added, none removed,
    renamed or reordered."""

    model: Any  # the policy (a PeftModel in training; the backbone's model, with or without adapter, in evaluation)
    loaded: "LoadedBackbone"  # the backbone: tokenizer / processor, special token ids
    inputs: dict[str, torch.Tensor]  # the prompts' model inputs, left padded [P, L]; inputs_embeds [P, L, H] if embedded
    group_size: int  # K responses per prompt
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_p: float = 0.9
    surprisal_from: str = "sampling"  # "sampling" (after temperature and top-p) or "policy" (-log π_old)
    group_ids: list[int] | None = None  # one id per prompt (None: 0..P-1)
    context: StepContext | None = None  # the training step, when sampling for one (None in evaluation and benchmarks)
    seed: int | None = None  # response k of the prompt with group id g is sampled from the key (seed, g, k), whatever
    # the batch it is in (``keyed_draw``); None: a seed drawn from torch's default generator
    fields: frozenset[str] | None = None  # the optional per-token statistics to compute (``sum_pi_squared``, a
    # backend's extra fields): those the run's estimator requires (``Engine.requires``); None: all it can

    def computes(self, name: str) -> bool:
        """Whether the optional per-token statistic ``name`` (``sum_pi_squared``, a
        backend's extra field) is asked for: named in ``fields``, or ``fields`` None
        (every one the backend can compute)."""
        return self.fields is None or name in self.fields


@dataclass(frozen=True)
class Rollout:
    """Sampled responses (rewards not yet scored: all 0)."""

    batch: RolloutBatch  # tokens (EOS included, -1 padded), surprisal, logprobs, sum_pi_squared
    prompt_index: torch.Tensor  # [N] int64: the prompt each response answers (K consecutive rows each)
    texts: list[str]  # decoded responses, special tokens skipped


@dataclass(frozen=True)
class PolicyLoss:
    """The loss and the statistics worth logging (all scalars; fields may be added, none
    removed: a plugin's loss may leave the optional ones None)."""

    loss: torch.Tensor  # differentiable
    policy_term: torch.Tensor  # -E[min(ρA, clip(ρ)A)]
    kl: torch.Tensor  # E[KL estimate] (the run's optim.kl_estimator; k3 by default)
    clip_fraction: torch.Tensor  # share of tokens where the clipped term was the minimum
    clip_fraction_low: torch.Tensor | None = None  # of them, tokens clipped at 1 - ε (negative advantage)
    clip_fraction_high: torch.Tensor | None = None  # tokens clipped at 1 + ε_high (positive advantage)
    entropy: torch.Tensor | None = None  # E[H] of the policy at the tokens, where computed
