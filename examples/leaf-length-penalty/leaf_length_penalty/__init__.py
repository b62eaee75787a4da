"""Reward = the run's task reward - 0.5 x (response tokens / rollout.max_new_tokens).

A ``score_rollouts`` stage plugin: named in a run config (``plugins: [length-penalty]``)
it replaces the built-in scoring, so every response pays for its length; installed but
not named, it changes nothing.
"""

from __future__ import annotations

import torch

from leaf_plugins import get_host, hookimpl

PENALTY = 0.5  # reward lost by a response that uses all of rollout.max_new_tokens


@hookimpl
def score_rollouts(context, rollout):
    """The task reward of every response minus its length penalty: float32 ``[N]``."""
    reward = get_host().rewards.get(context.config.reward)  # the run's reward, e.g. sentence_bleu
    references = [context.examples[i].reference for i in rollout.prompt_index.tolist()]
    task = torch.tensor(reward(rollout.texts, references), dtype=torch.float32)  # [N]
    lengths = rollout.batch.lengths.to(torch.float32).cpu()  # [N] response tokens, EOS included
    return task - PENALTY * lengths / context.config.rollout.max_new_tokens
