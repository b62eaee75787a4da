"""Reward = the run's task reward - penalty x (response tokens / rollout.max_new_tokens).

A ``score_rollouts`` stage plugin with a parameter: named in a run config
(``plugins: [length-penalty]``, or ``plugins: [{name: length-penalty, params: {penalty:
0.25}}]``) it replaces the built-in scoring, so every response pays for its length;
installed but not named, it changes nothing.

The entry point names the class ``LengthPenalty``: a run builds it with an instance of its
``parameters`` dataclass, whose fields leaf-plugins checks (type, ``__post_init__``'s
range, a misspelt name gets a did-you-mean) and ``leaf plugins`` lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from leaf_plugins import get_host, hookimpl
from leaf_plugins.core.parameters import configured


@dataclass(frozen=True)
class LengthPenaltyParams:
    """The length penalty's parameters."""

    penalty: float = field(default=0.5, metadata={
        "help": "reward lost by a response that uses all of rollout.max_new_tokens (>= 0)"})

    def __post_init__(self) -> None:
        if not 0 <= self.penalty < math.inf:
            raise ValueError(f"penalty must be a finite number >= 0, got {self.penalty!r}")


class LengthPenalty:
    """The task reward minus penalty x response tokens / rollout.max_new_tokens."""

    parameters = LengthPenaltyParams

    def __init__(self, params: LengthPenaltyParams) -> None:
        self.params = params

    @hookimpl
    def score_rollouts(self, context, rollout):
        """The task reward of every response minus its length penalty: float32 ``[N]``."""
        config = context.config
        # the run's reward (e.g. sentence_bleu) with its reward_params
        reward = configured("reward", config.reward, get_host().rewards.get(config.reward), config.reward_params)
        references = [context.examples[i].reference for i in rollout.prompt_index.tolist()]
        task = torch.tensor(reward(rollout.texts, references), dtype=torch.float32)  # [N]
        lengths = rollout.batch.lengths.to(torch.float32).cpu()  # [N] response tokens, EOS included
        return task - self.params.penalty * lengths / config.rollout.max_new_tokens
