"""Reward = the run's reward - penalty x (response tokens / rollout.max_new_tokens).

A ``score_rollouts`` stage plugin with a parameter: named in a run config
(``plugins: [length-penalty]``, or ``plugins: [{name: length-penalty, params: {penalty:
0.25}}]``) it replaces the built-in scoring, so every response pays for its length;
installed but not named, it changes nothing.

The entry point names the class ``LengthPenalty``, whose ``@parameterised`` declares its
parameters: a run builds it with an instance of ``LengthPenaltyParams``, whose fields
leaf-plugins checks (type, ``__post_init__``'s range, a misspelt name gets a
did-you-mean) and ``leaf plugins`` lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from leaf_plugins import hookimpl, parameterised


@dataclass(frozen=True)
class LengthPenaltyParams:
    """The length penalty's parameters."""

    penalty: float = field(default=0.5, metadata={
        "help": "reward lost by a response that uses all of rollout.max_new_tokens (>= 0)"})

    def __post_init__(self) -> None:
        if not 0 <= self.penalty < math.inf:
            raise ValueError(f"penalty must be a finite number >= 0, got {self.penalty!r}")


@parameterised(LengthPenaltyParams)
class LengthPenalty:
    """The run's reward minus penalty x response tokens / rollout.max_new_tokens."""

    def __init__(self, params: LengthPenaltyParams) -> None:
        self.params = params

    @hookimpl
    def score_rollouts(self, context, rollout):
        """The run's reward of every response minus its length penalty: float32 ``[N]``."""
        # the run's configured rewards (reward: one name, or a weighted list), scored once per rollout
        scores = context.rewards.scores(rollout, context.examples)  # name -> [N]
        reward = context.rewards.total(scores)  # [N] their weighted sum
        lengths = rollout.batch.lengths.to(torch.float32).cpu()  # [N] response tokens, EOS included
        return reward - self.params.penalty * lengths / context.config.rollout.max_new_tokens
