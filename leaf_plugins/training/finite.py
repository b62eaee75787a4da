"""The trainer's guards against non-finite numbers: rewards screened where they enter
(``nonfinite_rewards: error | drop_group``), and no optimizer step on a non-finite loss
or gradient."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from leaf_plugins.core.errors import NonFiniteError
from leaf_plugins.core.finite import nonfinite_fields
from leaf_plugins.core.stages import Rollout
from leaf_plugins.core.task import Example
from leaf_plugins.training.checkpoint import latest_checkpoint

__all__ = ["NONFINITE_REWARD_POLICIES", "bad_reward_prompts", "check_update", "scorer_name"]

NONFINITE_REWARD_POLICIES = ("error", "drop_group")
"""``error``: stop at a NaN/inf reward; ``drop_group``: train the step without its group."""

SHOWN = 3  # bad responses named in a message


def scorer_name(hook: Any, rewards: list[str]) -> str:
    """Who scores the responses: the run's reward plugins (``rewards``: their names), or
    the plugin whose ``score_rollouts`` hook is called first (it overrides the built-in
    scoring)."""
    impls = hook.score_rollouts.get_hookimpls()
    first = impls[-1] if impls else None
    if first is None or type(first.plugin).__name__ == "DefaultStages":
        return (f"reward plugin {rewards[0]!r}" if len(rewards) == 1
                else f"the reward plugins {', '.join(map(repr, rewards))}")
    return f"score_rollouts of plugin {first.plugin_name!r}"


def bad_reward_prompts(
    rewards: torch.Tensor, rollout: Rollout, examples: list[Example], step: int, policy: str, scorer: str
) -> list[int]:
    """The prompts (rows of the step's examples) with a non-finite reward among their
    responses; empty when every reward is finite (one reduction, one sync).

    :param rewards: ``[N]`` the scores of ``rollout``'s responses.
    :param step: the 1-based step, for messages.
    :raises NonFiniteError: with policy ``error`` (naming the example, the response and
        the scorer), or when every group of the step is bad.
    """
    finite = torch.isfinite(rewards)  # [N]
    if bool(finite.all()):
        return []
    rows = (~finite).nonzero().squeeze(1).tolist()
    prompts = rollout.prompt_index.tolist()
    named = "; ".join(
        f"example {examples[prompts[row]].id!r} response {row} ({_response_text(rollout, row)}): {float(rewards[row])}"
        for row in rows[:SHOWN]
    )
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    bad = sorted({prompts[row] for row in rows})
    message = f"step {step}: {scorer} returned a non-finite reward for {named}{more}"
    if policy == "error":
        raise NonFiniteError(f"{message}. Fix the reward, or set nonfinite_rewards: drop_group to train without "
                             f"such groups")
    if len(bad) == len(examples):
        raise NonFiniteError(f"{message}: every group of the step has one, nothing is left to train on")
    return bad


def _response_text(rollout: Rollout, row: int) -> str:
    text = rollout.texts[row] if row < len(rollout.texts) else ""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def check_update(model: torch.nn.Module, loss: float, norm: float, step: int, output_dir: Path) -> None:
    """Raise ``NonFiniteError`` instead of letting the optimizer step on a non-finite
    loss or gradient; the message names the step, the first bad parameters and the
    newest checkpoint (untouched: nothing has been stepped or saved). ``loss`` and the
    gradient's global ``norm`` are the whole update's (summed over the processes), so
    every process of a launch takes the same decision."""
    if math.isfinite(loss) and math.isfinite(norm):
        return
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    bad = nonfinite_fields(grads)
    found = latest_checkpoint(output_dir)
    kept = f"the newest checkpoint, {found}, is intact" if found else "no checkpoint had been written yet"
    what = f"the loss is {loss}" if not math.isfinite(loss) else "the loss is finite"
    if bad:
        what += f"; the gradient of {', '.join(bad[:SHOWN])}{' and others' if len(bad) > SHOWN else ''} is not finite"
    elif not math.isfinite(norm):
        what += f"; the gradient's norm is {norm}"
    raise NonFiniteError(f"step {step}: {what}. The optimizer did not step and the run stops; {kept}")
