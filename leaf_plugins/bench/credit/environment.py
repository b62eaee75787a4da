"""A token-level task whose values and gradients are computable exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Regime", "Environment"]


@dataclass(frozen=True)
class Regime:
    """The knobs of one benchmark setting.

    ``decisions`` are the high-entropy positions whose tokens decide the reward; every
    other position is near-deterministic (its most likely token has probability about
    ``1 - 1e-2`` at temperature 1), so sampled responses share prefixes between decisions
    the way LLM rollouts do.
    """

    name: str = "base"
    horizon: int = 16
    vocab: int = 4
    decisions: tuple[int, ...] = (3, 8, 12)
    group_size: int = 8
    fork_budget: int = 2
    reward_noise: float = 0.0
    temperature: float = 1.0
    peak_logit: float = 6.0


@dataclass
class Environment:
    """Policy logits ``[H, V+1, V]`` over (position, previous token; ``V`` = start) and
    per-decision scores ``[H, V]`` in [0, 1] (zero off decision positions)."""

    regime: Regime
    logits: torch.Tensor  # [H, V+1, V] float64, the learnable policy parameters
    scores: torch.Tensor  # [H, V] float64, s_t(a); rows off decision positions are 0
    is_decision: torch.Tensor  # [H] bool

    @classmethod
    def build(cls, regime: Regime, seed: int) -> "Environment":
        generator = torch.Generator().manual_seed(seed)
        h, v = regime.horizon, regime.vocab
        logits = torch.zeros(h, v + 1, v, dtype=torch.float64)
        preferred = torch.randint(0, v, (h, v + 1), generator=generator)
        logits.scatter_(2, preferred.unsqueeze(2), regime.peak_logit)
        is_decision = torch.zeros(h, dtype=torch.bool)
        is_decision[list(regime.decisions)] = True
        logits[is_decision] = 0.3 * torch.randn(int(is_decision.sum()), v + 1, v, generator=generator, dtype=torch.float64)
        scores = torch.rand(h, v, generator=generator, dtype=torch.float64) * is_decision.unsqueeze(1)
        return cls(regime, logits / regime.temperature, scores, is_decision)

    @property
    def start(self) -> int:
        """Index of the start-of-response 'previous token'."""
        return self.regime.vocab

    def policy(self, logits: torch.Tensor | None = None) -> torch.Tensor:
        """``[H, V+1, V]`` next-token probabilities."""
        return torch.softmax(self.logits if logits is None else logits, dim=-1)

    def reward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Noise-free reward ``[N]`` in [0, 1] of responses ``[N, H]``: the mean score of
        the tokens taken at the decision positions."""
        positions = torch.arange(self.regime.horizon)
        return self.scores[positions, tokens].sum(dim=1) / len(self.regime.decisions)
