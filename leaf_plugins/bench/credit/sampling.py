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

    tokens: torch.Tensor  # [N, H] int64, -1 past the end
    lengths: torch.Tensor  # [N] int64, the end token included
    previous: torch.Tensor  # [N, H] int64: previous token (V = start), 0 past the end
    batch: RolloutBatch  # tokens, noisy rewards, group ids, surprisal, logprobs, sum_pi_squared

    @property
    def count(self) -> int:
        return self.batch.groups.count

    @property
    def mask(self) -> torch.Tensor:
        """``[N, H]`` bool, True on real tokens."""
        return self.batch.mask


def sample_groups(env: Environment, groups: int, generator: torch.Generator) -> Groups:
    """``groups`` independent groups of K responses (K = the regime's group size).

    ``logprobs`` and ``sum_pi_squared`` are exact (the benchmark knows π); the surprisal
    is ``-logprobs``.
    """
    regime = env.regime
    n, h = groups * regime.group_size, regime.horizon
    policy = env.policy().detach()  # [H, V+1, A]
    tokens = torch.full((n, h), -1, dtype=torch.int64)
    previous_all = torch.zeros(n, h, dtype=torch.int64)
    previous = torch.full((n,), env.start, dtype=torch.int64)
    running = torch.ones(n, dtype=torch.bool)
    lengths = torch.full((n,), h, dtype=torch.int64)
    for t in range(h):  # a Markov chain is sampled one position at a time
        drawn = torch.multinomial(policy[t, previous], 1, generator=generator).squeeze(1)
        previous_all[:, t] = torch.where(running, previous, 0)
        tokens[:, t] = torch.where(running, drawn, -1)
        stopped = running & (drawn == regime.end)
        lengths[stopped] = t + 1
        running &= ~stopped
        previous = torch.where(running, drawn, 0)
    real = tokens >= 0
    positions = torch.arange(h).expand(n, h)
    here = policy[positions, previous_all]  # [N, H, A]
    logprobs = torch.where(real, torch.log(here.gather(2, tokens.clamp(min=0).unsqueeze(2)).squeeze(2)), 0.0)
    sum_pi_squared = torch.where(real, here.square().sum(dim=2), 0.0)
    rewards = env.reward(tokens, lengths)
    if regime.reward_noise:
        rewards = rewards + regime.reward_noise * torch.randn(n, generator=generator, dtype=torch.float64)
    batch = RolloutBatch(
        tokens=tokens,
        lengths=lengths,
        group_ids=torch.arange(groups).repeat_interleave(regime.group_size),
        rewards=rewards.float(),
        surprisal=(-logprobs).float(),
        logprobs=logprobs.float(),
        sum_pi_squared=sum_pi_squared.float(),
        vocab_size=regime.actions,
    )
    return Groups(tokens, lengths, previous_all, batch)
