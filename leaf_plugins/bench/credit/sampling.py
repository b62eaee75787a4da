"""Sampling K-response groups from the tabular policy, as a RolloutBatch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaf_plugins.bench.credit.environment import Environment
from leaf_plugins.core.batch import RolloutBatch

__all__ = ["Groups", "sample_groups"]


@dataclass(frozen=True)
class Groups:
    """Sampled responses with what the measures need."""

    tokens: torch.Tensor  # [N, H] int64
    previous: torch.Tensor  # [N, H] int64: previous token (V = start)
    batch: RolloutBatch  # tokens, noisy rewards, group ids, surprisal

    @property
    def count(self) -> int:
        return self.batch.groups.count


def sample_groups(env: Environment, groups: int, generator: torch.Generator) -> Groups:
    """``groups`` independent groups of K responses (K = the regime's group size)."""
    regime = env.regime
    n = groups * regime.group_size
    policy = env.policy().detach()  # [H, V+1, V]
    tokens = torch.empty(n, regime.horizon, dtype=torch.int64)
    previous = torch.full((n,), env.start, dtype=torch.int64)
    previous_all = torch.empty_like(tokens)
    for t in range(regime.horizon):  # a Markov chain is sampled one position at a time
        previous_all[:, t] = previous
        tokens[:, t] = torch.multinomial(policy[t, previous], 1, generator=generator).squeeze(1)
        previous = tokens[:, t]
    positions = torch.arange(regime.horizon)
    surprisal = -torch.log(policy[positions, previous_all, tokens]).float()  # [N, H]
    rewards = env.reward(tokens)
    if regime.reward_noise:
        rewards = rewards + regime.reward_noise * torch.randn(n, generator=generator, dtype=torch.float64)
    batch = RolloutBatch(
        tokens=tokens,
        lengths=torch.full((n,), regime.horizon, dtype=torch.int64),
        group_ids=torch.arange(groups).repeat_interleave(regime.group_size),
        rewards=rewards.float(),
        surprisal=surprisal,
        vocab_size=regime.vocab,
    )
    return Groups(tokens, previous_all, batch)
