"""The recipes' settings in a real run of the built-in tiny backbone: dynamic sampling
trains only informative groups, several weighted rewards are logged each and summed,
overlong responses are masked or penalised, a KL in the reward is subtracted from it,
and every step's statistics are in ``metrics.jsonl``."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from leaf_plugins import hookimpl
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.training.lora import lora_state
from leaf_plugins.training.overlong import overlong_buffer, overlong_penalty
from leaf_plugins.training.trainer import Trainer
from test_training_finite import PoisonReward, poisoned_examples
from training_cases import TestRewards, config, examples

EXACT = 1e-6
"""A logged figure against the same figure computed from other logged values: float32
means of at most 32 rewards, written with Python's float repr (about 1e-7 relative)."""


def length_tenth(predictions: list[str], references: list[str]) -> list[float]:
    """A tenth of the response's characters."""
    return [len(p) / 10 for p in predictions]


class LengthReward:
    @hookimpl
    def register_rewards(self, register):
        register("length_tenth", length_tenth)


def recipe_host() -> PluginHost:
    return PluginHost.discover(extra_plugins=[("test-rewards", TestRewards()), ("poison", PoisonReward()),
                                              ("length", LengthReward())], strict=True)


def metrics_of(output) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def groups_of(output) -> list[dict]:
    return [json.loads(line) for line in (output / "rollouts.jsonl").read_text().splitlines()]


def test_dynamic_sampling_trains_informative_groups_only(tmp_path):
    settings = config(tmp_path, steps=3, checkpoint_every=3)
    settings.reward, settings.log_rollouts = "flat_on_poison", True
    settings.rollout = dataclasses.replace(settings.rollout, dynamic_sampling=True, max_sampling_rounds=3)
    trainer = Trainer(settings, poisoned_examples(set(range(0, 16, 2))), host=recipe_host())  # half score 0
    trainer.run()
    metrics, logged = metrics_of(tmp_path), groups_of(tmp_path)
    for entry in metrics:
        step_groups = [group for group in logged if group["step"] == entry["step"]]
        assert len(step_groups) == 4  # prompts_per_step, whatever the rounds
        flat = [group for group in step_groups if len(set(group["rewards"])) == 1]
        # an all-equal group trains only when the last round still left the step short
        assert not flat or entry["sampling_rounds"] == 3, entry
    assert any(entry["sampling_rounds"] > 1 for entry in metrics)  # half the prompts are flat: rounds were needed
    assert all(0 < entry["zero_std_groups"] < 1 for entry in metrics)


def test_weighted_rewards_are_logged_each_and_summed(tmp_path):
    settings = config(tmp_path, steps=2, checkpoint_every=2)
    settings.reward = [{"name": "vowel_share", "weight": 0.5}, {"name": "length_tenth", "weight": 2.0}]
    Trainer(settings, examples(), host=recipe_host()).run()
    for entry in metrics_of(tmp_path):
        assert entry["reward_mean"] == pytest.approx(0.5 * entry["reward/vowel_share"]
                                                     + 2.0 * entry["reward/length_tenth"], rel=EXACT)
        assert entry["reward/length_tenth"] > 0


def test_overlong_penalty_is_dapo_s_ramp_on_each_response(tmp_path):
    settings = config(tmp_path, steps=2, checkpoint_every=2)
    settings.log_rollouts = True
    settings.rollout = dataclasses.replace(settings.rollout, max_new_tokens=8, overlong="penalty", overlong_buffer=4,
                                           overlong_penalty_factor=0.5)
    Trainer(settings, examples(), host=recipe_host()).run()
    logged = groups_of(tmp_path)
    for entry in metrics_of(tmp_path):
        lengths = torch.tensor([len(tokens) for group in logged if group["step"] == entry["step"]
                                for tokens in group["tokens"]])
        expected = overlong_penalty(lengths, 8, overlong_buffer(8, 4), 0.5).mean().item()
        assert entry["reward_penalty_mean"] == pytest.approx(expected, abs=EXACT)
        assert entry["reward_penalty_mean"] < 0  # a random model's responses run to the limit


def test_masked_overlong_responses_do_not_train(tmp_path):
    settings = config(tmp_path, steps=1, checkpoint_every=1)
    settings.rollout = dataclasses.replace(settings.rollout, max_new_tokens=2, overlong="mask")
    settings.optim = dataclasses.replace(settings.optim, weight_decay=0.0)
    trainer = Trainer(settings, examples(), host=recipe_host())
    before = {name: value.clone() for name, value in lora_state(trainer.policy).items()}
    trainer.run()
    (entry,) = metrics_of(tmp_path)
    assert entry["truncated_fraction"] == 1.0  # 2 tokens of a random model over its vocabulary: no EOS
    assert entry["grad_norm"] == 0.0 and entry["loss"] == 0.0
    after = lora_state(trainer.policy)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_kl_in_the_reward_starts_at_the_rounding_of_a_policy_equal_to_the_reference(tmp_path):
    settings = config(tmp_path, steps=3, checkpoint_every=3)
    settings.optim = dataclasses.replace(settings.optim, kl_in="reward", kl_estimator="k2", kl_coefficient=0.5)
    Trainer(settings, examples(), host=recipe_host()).run()
    metrics = metrics_of(tmp_path)
    # step 1: the LoRA update is 0, so π_θ = π_ref but for the sampler's and the teacher-forced
    # pass's float32 rounding (about 1e-6 in a log-prob, squared by k2)
    assert abs(metrics[0]["reward_penalty_mean"]) < 1e-6
    assert metrics[2]["reward_penalty_mean"] < -1e-6  # trained away from π_ref: a KL (k2 ≥ 0) is subtracted
    assert all(entry["reward_penalty_mean"] <= 0 for entry in metrics)
    assert all(math.isfinite(entry["kl"]) for entry in metrics)


def test_every_step_logs_the_statistics_people_read(tmp_path):
    settings = config(tmp_path, steps=1, checkpoint_every=1)
    settings.optim = dataclasses.replace(settings.optim, clip_epsilon_high=0.28, entropy_coefficient=0.001,
                                         importance_sampling_level="sequence", rollout_correction="tis")
    trainer = Trainer(settings, examples(), host=recipe_host())
    vocabulary = trainer.loaded.model.get_output_embeddings().weight.shape[0]
    trainer.run()
    (entry,) = metrics_of(tmp_path)
    expected = {"reward_mean", "reward_std", "reward/vowel_share", "response_tokens_mean", "response_tokens_max",
                "response_tokens_min", "truncated_fraction", "advantage_mean", "advantage_abs_mean", "zero_std_groups",
                "sampling_rounds", "loss", "kl", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
                "entropy", "grad_norm", "learning_rate", "rollout_logprob_gap", "rollout_kl", "tokens_per_second",
                "rollout_seconds", "estimator_seconds", "update_seconds"}
    assert expected <= entry.keys(), expected - entry.keys()
    assert entry["clip_fraction"] == pytest.approx(entry["clip_fraction_low"] + entry["clip_fraction_high"], abs=EXACT)
    assert 0 < entry["entropy"] <= math.log(vocabulary) + EXACT  # a distribution over V tokens: at most log V
    assert entry["rollout_logprob_gap"] < 1e-4 and entry["rollout_kl"] >= 0  # the same float32 weights sample



@pytest.mark.parametrize("kl_in", ["loss", "reward"])
def test_a_kl_coefficient_of_0_runs_no_reference_pass(tmp_path, monkeypatch, kl_in):
    from leaf_plugins.training import update

    passes = []
    real = update._reference_pass
    monkeypatch.setattr(update, "_reference_pass", lambda *args: passes.append(1) or real(*args))
    settings = config(tmp_path / "with", steps=1, checkpoint_every=1)
    settings.optim = dataclasses.replace(settings.optim, kl_in=kl_in)
    Trainer(settings, examples(), host=recipe_host()).run()
    assert passes  # β = 0.02: the reference policy's log-probs are computed
    passes.clear()
    settings = config(tmp_path / "without", steps=1, checkpoint_every=1)
    settings.optim = dataclasses.replace(settings.optim, kl_in=kl_in, kl_coefficient=0.0)
    Trainer(settings, examples(), host=recipe_host()).run()
    assert passes == [] and metrics_of(tmp_path / "without")[0]["kl"] == 0.0


def test_a_resumed_run_of_every_recipe_setting_is_bit_identical(tmp_path):
    from leaf_plugins.training.step_metrics import reproducible
    from test_training_resume import CrashAt

    def run(output, plugins=()):
        settings = config(output, steps=4, checkpoint_every=2)
        settings.reward, settings.log_rollouts = [{"name": "flat_on_poison", "weight": 2.0}], True
        settings.rollout = dataclasses.replace(settings.rollout, dynamic_sampling=True)
        settings.optim = dataclasses.replace(settings.optim, clip_epsilon_high=0.28, dual_clip=3.0,
                                             importance_sampling_level="sequence", kl_in="reward", kl_estimator="k1",
                                             entropy_coefficient=0.001, rollout_correction="mis",
                                             rollout_correction_level="sequence", updates_per_rollout=2)
        trainer = Trainer(settings, poisoned_examples(set(range(0, 16, 2))), plugins=list(plugins), host=recipe_host())
        return trainer, trainer.run()

    straight, straight_metrics = run(tmp_path / "straight")
    with pytest.raises(RuntimeError):  # a crash after step 3: the rerun resumes from step 2's checkpoint
        run(tmp_path / "resumed", [CrashAt(3)])
    resumed, resumed_metrics = run(tmp_path / "resumed")
    assert max(m["sampling_rounds"] for m in straight_metrics) > 1
    for name, value in lora_state(straight.policy).items():
        assert torch.equal(value, lora_state(resumed.policy)[name]), name
    assert [reproducible(m) for m in metrics_of(tmp_path / "resumed")] == \
        [reproducible(m) for m in metrics_of(tmp_path / "straight")]
    assert [reproducible(m) for m in resumed_metrics] == [reproducible(m) for m in straight_metrics][2:]
    assert groups_of(tmp_path / "resumed") == groups_of(tmp_path / "straight")
