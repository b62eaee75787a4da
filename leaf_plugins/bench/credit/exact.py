"""Exact values, advantages and policy gradient by dynamic programming.

The reward is a sum over decision positions of a score of the token taken there, and
the policy is Markov in (position, previous token), so the expected future score from
position ``t`` depends only on ``(t, previous token)``:
``W[t, prev] = Σ_a π(a | t, prev) (s_t(a) + W[t+1, a])`` with ``W[H, ·] = 0``. Then
``V(y_<t) = (score of y_<t + W[t, y_{t-1}]) / |D|`` and
``Q(y_<t, a) = (score of y_<t + s_t(a) + W[t+1, a]) / |D|``.
"""

from __future__ import annotations

import torch

from leaf_plugins.bench.credit.environment import Environment

__all__ = ["future_scores", "expected_reward", "exact_gradient", "true_advantages"]


def future_scores(env: Environment, logits: torch.Tensor | None = None) -> torch.Tensor:
    """``[H+1, V+1]`` W: expected score still to come from position t after ``prev``
    (column ``V`` is the start token; differentiable in ``logits``)."""
    policy = env.policy(logits)  # [H, V+1, V]
    h, v = env.regime.horizon, env.regime.vocab
    rows = [torch.zeros(v + 1, dtype=policy.dtype)]
    for t in reversed(range(h)):  # the horizon, not the tokens of a batch
        after = rows[-1][:v]  # [V]: W[t+1, a]
        rows.append((policy[t] * (env.scores[t] + after)).sum(dim=-1))  # [V+1]
    return torch.stack(rows[::-1])


def expected_reward(env: Environment, logits: torch.Tensor | None = None) -> torch.Tensor:
    """J = E[r], a differentiable scalar."""
    return future_scores(env, logits)[0, env.start] / len(env.regime.decisions)


def exact_gradient(env: Environment) -> torch.Tensor:
    """``[H, V+1, V]`` ∇J with respect to the logits."""
    logits = env.logits.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(expected_reward(env, logits), logits)
    return gradient


def true_advantages(env: Environment, tokens: torch.Tensor) -> torch.Tensor:
    """``[N, H]`` Q(y_<t, a_t) - V(y_<t) for every token of responses ``[N, H]``."""
    with torch.no_grad():
        future = future_scores(env)  # [H+1, V+1]
    n, h = tokens.shape
    previous = torch.cat([torch.full((n, 1), env.start), tokens[:, :-1]], dim=1)  # [N, H]
    positions = torch.arange(h)
    value_here = future[positions, previous]  # [N, H]: W[t, prev]
    value_next = future[positions + 1, tokens]  # [N, H]: W[t+1, a_t]
    taken = env.scores[positions, tokens]  # [N, H]
    return (taken + value_next - value_here) / len(env.regime.decisions)
