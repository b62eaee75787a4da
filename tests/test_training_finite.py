"""The trainer never trains on a non-finite number: bad rewards are named (or their
groups dropped), a non-finite loss or gradient stops the run before the optimizer
steps, with the last checkpoint intact."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from leaf_plugins import hookimpl
from leaf_plugins.core.errors import ConfigError, NonFiniteError
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.training.config import load_train_config
from leaf_plugins.training.lora import lora_state
from leaf_plugins.training.trainer import Trainer
from training_cases import TestRewards, config, examples, host, vowel_share

POISON = "poison"  # the reference of the examples whose reward is NaN


def nan_on_poison(predictions: list[str], references: list[str]) -> list[float]:
    scores = vowel_share(predictions, references)
    return [math.nan if reference == POISON else score for score, reference in zip(scores, references)]


def flat_on_poison(predictions: list[str], references: list[str]) -> list[float]:
    """0 for every response to a poisoned example (an uninformative group), else the vowel share."""
    scores = vowel_share(predictions, references)
    return [0.0 if reference == POISON else score for score, reference in zip(scores, references)]


class PoisonReward:
    @hookimpl
    def register_rewards(self, register):
        register("nan_on_poison", nan_on_poison)
        register("flat_on_poison", flat_on_poison)


def poisoned_host() -> PluginHost:
    return PluginHost.discover(extra_plugins=[("test-rewards", TestRewards()), ("poison", PoisonReward())], strict=True)


def poisoned_examples(poisoned: set[int]):
    return [dataclasses.replace(e, reference=POISON) if i in poisoned else e for i, e in enumerate(examples())]


def test_a_nan_reward_stops_the_run_naming_the_example_and_the_reward_plugin(tmp_path):
    settings = config(tmp_path, steps=1)
    settings.reward = "nan_on_poison"
    trainer = Trainer(settings, poisoned_examples(set(range(16))), host=poisoned_host())
    with pytest.raises(NonFiniteError) as error:
        trainer.run()
    message = str(error.value)
    assert message.startswith("step 1: reward plugin 'nan_on_poison' returned a non-finite reward for example 'clip-")
    assert "response 0 (" in message and ": nan" in message and "and 29 more" in message  # 4 prompts x K=8
    assert "nonfinite_rewards: drop_group" in message
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "metrics.jsonl").exists()


def test_drop_group_trains_on_the_other_groups_and_logs_how_many_were_dropped(tmp_path):
    poisoned = {0, 3, 5, 6, 9}
    settings = config(tmp_path, steps=3, checkpoint_every=3)
    settings.reward, settings.nonfinite_rewards, settings.log_rollouts = "nan_on_poison", "drop_group", True
    trainer = Trainer(settings, poisoned_examples(poisoned), host=poisoned_host())
    expected = [sum(trainer.examples.index(e) in poisoned for e in trainer._prompts_of(step)) for step in range(3)]
    assert sum(expected) > 0 and all(count < 4 for count in expected)
    trainer.run()
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["groups_dropped"] for m in metrics] == expected
    assert all(math.isfinite(m["reward_mean"]) and math.isfinite(m["loss"]) for m in metrics)
    logged = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [sum(r["step"] == step + 1 for r in logged) for step in range(3)] == [4 - n for n in expected]
    assert all(bool(torch.isfinite(value).all()) for value in lora_state(trainer.policy).values())


class BreakLossAt:
    """Wraps compute_loss to break it at one step: a NaN loss, or a finite loss (0)
    whose gradient is NaN (d sqrt(x)/dx at 0)."""

    def __init__(self, step: int, kind: str) -> None:
        self.step, self.kind = step, kind

    @hookimpl(wrapper=True)
    def compute_loss(self, context, logprobs, old_logprobs, reference_logprobs, advantages, mask):
        result = yield
        if context.step != self.step:
            return result
        moved = (logprobs - logprobs.detach())[mask].sum()
        loss = result.loss + math.nan if self.kind == "loss" else torch.sqrt(moved * moved)
        return dataclasses.replace(result, loss=loss)


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_a_non_finite_loss_or_gradient_is_never_stepped_and_the_last_checkpoint_is_intact(tmp_path, kind):
    settings = dataclasses.replace(config(tmp_path, steps=3, checkpoint_every=2), plugins=["break-loss"])
    installed = PluginHost.discover(extra_plugins=[("test-rewards", TestRewards()), ("break-loss", BreakLossAt(3, kind))],
                                    strict=True)
    trainer = Trainer(settings, examples(), host=installed)
    with pytest.raises(NonFiniteError) as error:
        trainer.run()
    message = str(error.value)
    assert message.startswith("step 3: ")
    assert ("the loss is nan" in message) == (kind == "loss")
    assert ("lora" in message and "is not finite" in message) == (kind == "gradient")
    assert f"{tmp_path / 'checkpoint-00000002'}, is intact" in message
    assert trainer.completed == 2
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "checkpoint-00000002" / "adapter" / "adapter_model.safetensors"))
    current = lora_state(trainer.policy)
    assert len(saved) == len(current)
    for value in current.values():  # the weights are those of the checkpoint: the optimizer did not step
        assert bool(torch.isfinite(value).all())
        assert any(torch.equal(value, other) for other in saved.values())
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_the_policy_option_is_validated_with_its_location(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 2\nnonfinite_rewards: skip\n")
    with pytest.raises(ConfigError, match=r"run.yaml:2:1: nonfinite_rewards: must be one of error, drop_group"):
        load_train_config(path, host=host())
