"""The run's rewards: one registered reward, or several with weights.

``reward: sentence_bleu`` (with ``reward_params``) is one reward of weight 1;
``reward: [{name: sentence_bleu, weight: 1.0}, {name: exact_match, weight: 0.5, params:
{...}}]`` several, each built with its own parameters. The step's reward of a response
is the weighted sum of its scores; every reward's scores are kept, so each is logged
(``reward/NAME``, its whole-step mean) and a ``score_rollouts`` plugin can build on
them (``StepContext.rewards``) instead of computing them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from leaf_plugins.core.errors import ConfigError, LeafError, suggest
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.stages import Rollout

__all__ = ["RewardEntry", "reward_entries", "reward_validator", "RunRewards", "REWARD_KEYS"]

REWARD_KEYS = ("name", "weight", "params")
"""The keys of an entry of a ``reward`` list."""


@dataclass(frozen=True)
class RewardEntry:
    """One of the run's rewards: a registered name, its weight and its parameters."""

    name: str
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)


def reward_entries(reward: str | Sequence[Mapping[str, Any]], reward_params: Mapping[str, Any]) -> list[RewardEntry]:
    """The run's rewards from its ``reward`` and ``reward_params`` (which belong to a
    single named reward; the entries of a list carry their own ``params``)."""
    if isinstance(reward, str):
        return [RewardEntry(reward, 1.0, dict(reward_params))]
    return [RewardEntry(entry["name"], float(entry.get("weight", 1.0)), dict(entry.get("params") or {}))
            for entry in reward]


def reward_validator(host: PluginHost) -> Callable[[Any], str | None]:
    """A config validator of ``reward``: a registered name, or a non-empty list of
    ``{name, weight, params}`` entries, each name registered and given once, each weight
    a finite number (the first problem; the parameters are checked with the config's
    other plugin parameters)."""

    def check(value: Any) -> str | None:
        if isinstance(value, str):
            return _registered(host, value)
        if not isinstance(value, list) or not value:
            return f"must be a registered reward's name or a list of {{name, weight, params}} entries, got {value!r}"
        names = []
        for index, entry in enumerate(value):
            if not isinstance(entry, Mapping):
                return f"entry {index + 1} must be a mapping {{name, weight, params}}, got {entry!r}"
            unknown = [key for key in entry if key not in REWARD_KEYS]
            if unknown:
                return (f"entry {index + 1} has no key {unknown[0]!r}.{suggest(str(unknown[0]), REWARD_KEYS)} "
                        f"Keys: {', '.join(REWARD_KEYS)}")
            if "name" not in entry:
                return f"entry {index + 1} names no reward (name: ...)"
            problem = _registered(host, entry["name"])
            if problem:
                return f"entry {index + 1}: {problem}"
            weight = entry.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                return f"entry {index + 1} ({entry['name']}): weight must be a finite number, got {weight!r}"
            if not isinstance(entry.get("params") or {}, Mapping):
                return f"entry {index + 1} ({entry['name']}): params must be a mapping, got {entry['params']!r}"
            names.append(entry["name"])
        repeated = sorted({name for name in names if names.count(name) > 1})
        return f"reward {repeated[0]!r} is named twice" if repeated else None

    return check


def _registered(host: PluginHost, name: Any) -> str | None:
    try:
        host.rewards.get(name)
    except LeafError as error:
        return str(error)
    return None


class RunRewards:
    """The run's configured rewards (``reward_entries``), each built with its parameters."""

    def __init__(self, entries: Sequence[RewardEntry], host: PluginHost) -> None:
        if not entries:
            raise ConfigError("a run needs at least one reward")
        self.entries = list(entries)
        self.functions = [configured("reward", entry.name, host.rewards.get(entry.name), entry.params)
                          for entry in self.entries]
        self._cached: tuple[Rollout, dict[str, torch.Tensor]] | None = None  # the rollout last scored

    @property
    def names(self) -> list[str]:
        """The rewards' names, in the run config's order."""
        return [entry.name for entry in self.entries]

    def scores(self, rollout: Rollout, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Each reward's ``[N]`` float32 scores of ``rollout``'s responses against the
        references of ``examples`` (the prompts ``rollout.prompt_index`` counts), computed
        once per rollout."""
        if self._cached is not None and self._cached[0] is rollout:
            return self._cached[1]
        references = [examples[i].reference for i in rollout.prompt_index.tolist()]
        scores = {entry.name: torch.tensor(function(rollout.texts, references), dtype=torch.float32)
                  for entry, function in zip(self.entries, self.functions)}
        self._cached = (rollout, scores)
        return scores

    def total(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[N]`` float32: the weighted sum of ``scores`` (the step's reward)."""
        total = torch.zeros_like(next(iter(scores.values())))
        for entry in self.entries:
            total = total + entry.weight * scores[entry.name]
        return total
