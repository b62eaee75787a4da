"""Synthetic rollout batches shaped like real ones: K responses per prompt that share a
trunk and branch off at random depths, lengths varying, random surprisal (with the matching
log-probabilities and a Σπ² consistent with them)."""

from __future__ import annotations

import torch

import leaf_plugins as lp

SIZES = {  # name: (prompts, K, max tokens)
    "fixed-cost-2x2x8": (2, 2, 8),  # almost no data: the per-call cost of the operations themselves
    "paper-6x8x200": (6, 8, 200),
    "64x8x1024": (64, 8, 1024),
    "256x16x2048": (256, 16, 2048),
}


def synthetic_batch(prompts: int, group_size: int, max_tokens: int, vocab: int = 32000, seed: int = 0) -> lp.RolloutBatch:
    """A padded batch of ``prompts * group_size`` responses of at most ``max_tokens``."""
    generator = torch.Generator().manual_seed(seed)
    n = prompts * group_size
    trunks = torch.randint(0, vocab, (prompts, max_tokens), generator=generator)  # [P, T]
    tokens = trunks.repeat_interleave(group_size, dim=0)  # [N, T]
    # each response leaves its trunk at a random depth, and some branch again later
    branch = torch.randint(1, max_tokens, (n, 1), generator=generator)
    fresh = torch.randint(0, vocab, (n, max_tokens), generator=generator)
    positions = torch.arange(max_tokens)
    tokens = torch.where(positions >= branch, fresh, tokens)
    lengths = torch.randint(max_tokens // 2, max_tokens + 1, (n,), generator=generator)
    mask = positions < lengths.unsqueeze(1)
    tokens = torch.where(mask, tokens, -1)
    surprisal = torch.where(mask, torch.rand(n, max_tokens, generator=generator) * 4, 0.0)
    rewards = torch.rand(n, generator=generator)
    group_ids = torch.arange(prompts).repeat_interleave(group_size)
    # the policy behind the surprisal: π of the sampled token, and Σ_v π_v² between π² (the rest of the
    # mass spread thin) and π² + (1 - π)² (the rest on a single token)
    pi = torch.exp(-surprisal)  # [N, T]
    spread = torch.rand(n, max_tokens, generator=generator)
    sum_pi_squared = torch.where(mask, pi * pi + (1 - pi) ** 2 * spread, 0.0)
    return lp.RolloutBatch(tokens, lengths, group_ids, rewards, surprisal=surprisal, logprobs=-surprisal,
                           sum_pi_squared=sum_pi_squared, vocab_size=vocab)


def as_reference_groups(batch: lp.RolloutBatch):
    """The batch as the reference implementation's list of groups."""
    from reference_estimators import Response  # tests/ is put on sys.path by conftest

    groups: dict[int, list] = {}
    for i in range(batch.size):
        length = int(batch.lengths[i])
        groups.setdefault(int(batch.group_ids[i]), []).append(
            Response(batch.tokens[i, :length].tolist(), float(batch.rewards[i]), batch.surprisal[i, :length].tolist())
        )
    return [groups[g] for g in sorted(groups)]


def as_policy_groups(batch: lp.RolloutBatch):
    """The batch as ``otb``'s reference implementation's list of groups."""
    from reference_otb import PolicyResponse  # tests/ is put on sys.path by conftest

    groups: dict[int, list] = {}
    for i in range(batch.size):
        length = int(batch.lengths[i])
        groups.setdefault(int(batch.group_ids[i]), []).append(
            PolicyResponse(batch.tokens[i, :length].tolist(), float(batch.rewards[i]),
                           batch.logprobs[i, :length].tolist(), batch.sum_pi_squared[i, :length].tolist())
        )
    return [groups[g] for g in sorted(groups)]
