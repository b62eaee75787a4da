"""Exact values, advantages and policy gradient by dynamic programming.

The reward is ``(S / norm) · F`` with ``S = Σ s_t(a_t)`` and ``F = Π ρ^{w_t(a_t)}``, and
the policy is Markov in (position, previous token). So the future from state
``(t, prev)`` needs two expectations only: ``M0 = E[F_future]`` and
``M1 = E[S_future · F_future]``, with ``M0 = 1, M1 = 0`` after the end token or the
horizon:

    M0[t, prev] = Σ_a π(a | t, prev) ρ^{w_t(a)} M0'(a)
    M1[t, prev] = Σ_a π(a | t, prev) ρ^{w_t(a)} (s_t(a) M0'(a) + M1'(a))

where ``M'(a)`` is ``M[t+1, a]`` for a content token and ``(1, 0)`` for the end token.
A prefix with score ``S_p`` and factor ``F_p`` at state ``(t, prev)`` then has value
``V = F_p (S_p M0 + M1) / norm``, and ``Q(prefix, a)`` is the same after ``a``.
"""

from __future__ import annotations

import torch

from leaf_plugins.bench.credit.environment import Environment

__all__ = ["future_moments", "expected_reward", "exact_gradient", "true_advantages", "state_values"]


def future_moments(env: Environment, parameters: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M0, M1)``, each ``[H+1, V+1]`` (differentiable in ``parameters``)."""
    policy = env.policy(parameters)  # [H, V+1, A]
    factor, scores = env.factor(), env.scores  # [H, A]
    h, v = env.regime.horizon, env.regime.vocab
    ones = torch.ones(1, dtype=policy.dtype)
    zero = torch.zeros(1, dtype=policy.dtype)
    m0 = [torch.ones(v + 1, dtype=policy.dtype)]
    m1 = [torch.zeros(v + 1, dtype=policy.dtype)]
    for t in reversed(range(h)):  # the horizon, not the tokens of a batch
        next0 = torch.cat([m0[-1][:v], ones])  # [A]: M0'(a), the end token ends the response
        next1 = torch.cat([m1[-1][:v], zero])
        weighted = policy[t] * factor[t]  # [V+1, A]
        m0.append(weighted @ next0)
        m1.append(weighted @ (scores[t] * next0 + next1))
    return torch.stack(m0[::-1]), torch.stack(m1[::-1])


def expected_reward(env: Environment, parameters: torch.Tensor | None = None) -> torch.Tensor:
    """J = E[r], a differentiable scalar."""
    _, m1 = future_moments(env, parameters)
    return m1[0, env.start] / env.norm


def exact_gradient(env: Environment) -> torch.Tensor:
    """∇J with respect to the learnable parameters (their shape)."""
    parameters = env.parameters.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(expected_reward(env, parameters), parameters)
    return gradient


@torch.no_grad()
def state_values(env: Environment, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V, Q)``, each ``[N, H]``: the value of every response's prefix before token t
    and after it (0 past the end)."""
    m0, m1 = future_moments(env)
    n, h = tokens.shape
    v = env.regime.vocab
    positions = torch.arange(h)
    real = positions < lengths.unsqueeze(1)  # [N, H]
    taken = torch.where(real, tokens, 0)
    previous = torch.cat([torch.full((n, 1), env.start), taken[:, :-1]], dim=1)  # [N, H]
    score = torch.where(real, env.scores[positions, taken], 0.0)  # [N, H]
    factor = torch.where(real, env.factor()[positions, taken], 1.0)
    score_before = score.cumsum(dim=1) - score  # S_p before t
    factor_before = torch.cat([torch.ones(n, 1, dtype=factor.dtype), factor.cumprod(dim=1)[:, :-1]], dim=1)
    value = factor_before * (score_before * m0[positions, previous] + m1[positions, previous]) / env.norm
    ended = taken == env.regime.end
    next0 = torch.where(ended, 1.0, m0[positions + 1, taken.clamp(max=v)])
    next1 = torch.where(ended, 0.0, m1[positions + 1, taken.clamp(max=v)])
    after = factor_before * factor * ((score_before + score) * next0 + next1) / env.norm
    return torch.where(real, value, 0.0), torch.where(real, after, 0.0)


def true_advantages(env: Environment, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[N, H]`` Q(y_<t, a_t) - V(y_<t) for every token (0 past the end)."""
    value, after = state_values(env, tokens, lengths)
    return after - value
