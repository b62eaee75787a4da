"""A token-level task whose values and gradients are computable exactly.

Responses are token sequences over ``V`` content tokens and, where the regime has a
reference length ``L``, an end-of-sequence token (id ``V``) that ends them; otherwise
every response is ``H`` tokens long. The policy is Markov in (position, previous token):
frozen *base* logits (a near-deterministic preferred token at most positions,
high-entropy *decision* positions) plus a learnable part, either a table (one logit per
state and token) or shared features ``φ(t, prev) @ Θ`` (a linear head over features that
states share, as a language model's head or a LoRA below it).

The reward of a response ``a_0 … a_{n-1}`` is ``(Σ_t s_t(a_t) / norm) · ρ^{Σ_t w_t(a_t)}``:
``s`` scores the tokens (a right word 1, a decision's variants their quality), ``w``
counts mistakes (a wrong word, an extra word past the reference, and at an early stop
the reference words left unsaid), ``ρ`` is the penalty per mistake. ``ρ = 1`` with
scores at decisions only is the additive task of the first version of this benchmark;
``0 < ρ < 1`` is graded (BLEU-like: fraction right times a penalty per wrong word);
``ρ = 0`` with every imperfect token a mistake is binary exact match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Regime", "Environment", "REWARDS"]

REWARDS = ("additive", "graded", "exact")


@dataclass(frozen=True)
class Regime:
    """The knobs of one benchmark setting.

    ``decisions`` are the high-entropy positions; every other position is
    near-deterministic (its preferred token has logit ``peak_logit``, the others 0).
    ``reference_length`` ``L`` (``None``: no end token, fixed length ``horizon``) is where
    the right answer ends: stopping before it leaves words unsaid, going on past it adds
    wrong words; ``stop_logit`` is the end token's logit at ``t = L`` (the length
    decision), ``early_stop_logit`` before it. ``features`` ``F > 0`` makes the learnable
    logits ``φ @ Θ`` with ``[F]`` features per state, of which a share
    ``feature_similarity`` (0 … 1) is common to all states. Estimators see
    ``batch_groups`` groups per call, as a training step's batch of prompts (an estimator
    may learn from the other groups of its batch).
    """

    name: str = "base"
    horizon: int = 16
    vocab: int = 4
    decisions: tuple[int, ...] = (3, 8, 12)
    group_size: int = 8
    batch_groups: int = 8  # groups per estimator call (a training step's prompts)
    fork_budget: int = 2
    reward: str = "additive"
    wrong_penalty: float = 0.5  # ρ for graded rewards
    reward_noise: float = 0.0
    temperature: float = 1.0
    peak_logit: float = 6.0
    decision_scale: float = 0.3  # std of the decision logits
    variants: int = 0  # plausible tokens at a decision (logit variant_logit + noise); 0: every token
    variant_logit: float = 4.0
    right_bias: float = 0.0  # extra logit of a decision's best variant
    reference_length: int | None = None
    stop_logit: float = 3.0
    early_stop_logit: float = -2.0
    features: int = 0
    feature_similarity: float = 0.0

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if self.reference_length is not None and not 0 < self.reference_length < self.horizon:
            raise ValueError("reference_length must lie in (0, horizon)")
        if any(not 0 <= d < (self.reference_length or self.horizon) for d in self.decisions):
            raise ValueError("decisions must lie inside the reference")

    @property
    def actions(self) -> int:
        """Tokens the policy chooses from: the content tokens and the end token."""
        return self.vocab + 1

    @property
    def end(self) -> int:
        """Id of the end-of-sequence token."""
        return self.vocab


@dataclass
class Environment:
    """Base logits, the learnable parameters, and the reward tables of one task.

    States are (position ``t``, previous token); the previous token of the first
    position is the *start*, index ``V`` (the end token never precedes a state).
    """

    regime: Regime
    base: torch.Tensor  # [H, V+1, A] float64 frozen logits (A = V+1 actions, the last is the end token)
    parameters: torch.Tensor  # [H, V+1, A] (table) or [F, A] (features), float64, learnable, starts at 0
    features: torch.Tensor | None  # [H, V+1, F] float64 φ, or None for the table
    scores: torch.Tensor  # [H, A] s_t(a)
    mistakes: torch.Tensor  # [H, A] w_t(a)
    norm: float  # the reward's denominator

    @classmethod
    def build(cls, regime: Regime, seed: int) -> "Environment":
        generator = torch.Generator().manual_seed(seed)
        h, v, a = regime.horizon, regime.vocab, regime.actions
        reference = regime.reference_length
        length = reference or h
        right = torch.randint(0, v, (h,), generator=generator)  # the reference's words
        base = torch.zeros(h, v + 1, a, dtype=torch.float64)
        if reference is None:  # additive task: a preferred token per (t, prev), no end token
            preferred = torch.randint(0, v, (h, v + 1), generator=generator)
            base.scatter_(2, preferred.unsqueeze(2), regime.peak_logit)
            base[:, :, regime.end] = -torch.inf
        else:
            base[torch.arange(h), :, right] = regime.peak_logit
            base[:reference, :, regime.end] = regime.early_stop_logit
            base[reference:, :, :] = 0.0
            base[reference, :, regime.end] = regime.stop_logit
            base[reference + 1 :, :, regime.end] = regime.peak_logit
        decisions = list(regime.decisions)
        noise = regime.decision_scale * torch.randn(len(decisions), v + 1, v, generator=generator, dtype=torch.float64)
        quality = torch.rand(h, v, generator=generator, dtype=torch.float64)  # a decision's variants
        if regime.variants:  # a few plausible variants; every other token is a rare mistake
            plausible = quality.argsort(dim=1, descending=True)[:, : regime.variants]  # [H, variants]
            offset = torch.zeros(h, v, dtype=torch.float64).scatter_(1, plausible, regime.variant_logit)
            quality = quality * (offset > 0)
            noise = noise + offset[decisions].unsqueeze(1)
        base[decisions, :, :v] = noise
        best = quality.argmax(dim=1)
        quality[torch.arange(h), best] = 1.0
        base[decisions, :, best[decisions]] += regime.right_bias
        scores, mistakes = _reward_tables(regime, right, quality, length)
        parameters, features = _learnable(regime, generator)
        norm = float(len(decisions)) if regime.reward == "additive" else float(length)
        return cls(regime, base / regime.temperature, parameters, features, scores, mistakes, norm)

    @property
    def start(self) -> int:
        """Index of the start-of-response 'previous token'."""
        return self.regime.vocab

    @property
    def penalty(self) -> float:
        """ρ: the reward's factor per mistake."""
        return {"additive": 1.0, "graded": self.regime.wrong_penalty, "exact": 0.0}[self.regime.reward]

    def logits(self, parameters: torch.Tensor | None = None) -> torch.Tensor:
        """``[H, V+1, A]`` policy logits: the base plus the learnable part."""
        parameters = self.parameters if parameters is None else parameters
        if self.features is None:
            return self.base + parameters
        return self.base + self.features @ parameters

    def policy(self, parameters: torch.Tensor | None = None) -> torch.Tensor:
        """``[H, V+1, A]`` next-token probabilities (differentiable in ``parameters``)."""
        return torch.softmax(self.logits(parameters), dim=-1)

    def factor(self) -> torch.Tensor:
        """``[H, A]`` ρ^{w_t(a)} (with 0^0 = 1)."""
        return torch.where(self.mistakes == 0, 1.0, torch.tensor(self.penalty, dtype=torch.float64) ** self.mistakes)

    def reward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Noise-free reward ``[N]`` of responses ``[N, H]`` (any id past ``lengths``)."""
        positions = torch.arange(self.regime.horizon)
        real = positions < lengths.unsqueeze(1)  # [N, H]
        taken = tokens.clamp(min=0)
        score = torch.where(real, self.scores[positions, taken], 0.0).sum(dim=1)
        factor = torch.where(real, self.factor()[positions, taken], 1.0).prod(dim=1)
        return score / self.norm * factor


def _reward_tables(regime: Regime, right: torch.Tensor, quality: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[H, A]`` scores s and mistakes w (see the module docstring)."""
    h, v = regime.horizon, regime.vocab
    scores = torch.zeros(h, v + 1, dtype=torch.float64)
    mistakes = torch.zeros(h, v + 1, dtype=torch.float64)
    decisions = list(regime.decisions)
    if regime.reward == "additive":
        scores[decisions, :v] = quality[decisions]
        return scores, mistakes
    inside = torch.arange(length)
    scores[inside, right[:length]] = 1.0
    mistakes[:length, :v] = 1.0
    mistakes[inside, right[:length]] = 0.0
    scores[decisions, :v] = quality[decisions]
    if regime.reward == "graded":
        mistakes[decisions, :v] = 0.0  # a decision's variants are synonyms of graded quality
    else:
        mistakes[decisions, :v] = (quality[decisions] < 1.0).double()  # only the best variant matches exactly
    mistakes[:length, regime.end] = (length - inside).double()  # words left unsaid at an early stop
    mistakes[length:, :v] = 1.0  # words past the reference
    return scores, mistakes


def _learnable(regime: Regime, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zero parameters and, for shared features, the unit-norm features ``[H, V+1, F]``."""
    h, v, a = regime.horizon, regime.vocab, regime.actions
    if not regime.features:
        return torch.zeros(h, v + 1, a, dtype=torch.float64), None
    own = torch.randn(h, v + 1, regime.features, generator=generator, dtype=torch.float64)
    common = torch.randn(regime.features, generator=generator, dtype=torch.float64)
    alpha = regime.feature_similarity
    features = (1 - alpha) ** 0.5 * own / own.norm(dim=2, keepdim=True) + alpha**0.5 * common / common.norm()
    return torch.zeros(regime.features, a, dtype=torch.float64), features
