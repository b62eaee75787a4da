"""Plugins named in the run config's ``plugins`` replace training stages through the
hooks; objects passed in code only observe; bad prompts are named."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from leaf_plugins import ConfigError, hookimpl
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.training.loss import LossSettings, policy_loss
from leaf_plugins.training.stage_plugins import PluginStageError, resolve_plugin
from leaf_plugins.training.trainer import Trainer
from training_cases import TestRewards, config, examples, host


class ConstantScores:
    """Scores every response 0.25 and records the losses it computed."""

    def __init__(self) -> None:
        self.losses = 0

    @hookimpl
    def score_rollouts(self, context, rollout):
        return torch.full((rollout.batch.size,), 0.25)

    @hookimpl
    def compute_loss(self, context, logprobs, old_logprobs, reference_logprobs, advantages, mask):
        self.losses += 1
        return policy_loss(logprobs, old_logprobs, reference_logprobs, advantages, mask,
                           LossSettings(clip_epsilon=0.1, kl_coefficient=0.0))


def test_plugins_replace_scoring_and_loss(tmp_path):
    plugin = ConstantScores()
    installed = PluginHost.discover(extra_plugins=[("test-rewards", TestRewards()), ("constant", plugin)], strict=True)
    trainer = Trainer(replace(config(tmp_path, "leaf", steps=2), plugins=["constant"]), examples(), host=installed)
    metrics = trainer.run()
    assert [m["reward_mean"] for m in metrics] == [0.25, 0.25]
    assert all(m["advantage_abs_mean"] == 0 for m in metrics)  # equal rewards: no credit anywhere
    assert plugin.losses == 4  # 2 steps × (4 prompts / micro-batches of 2)


class Probe:
    """Passed in code: it observes each step, and would change the run if it were named."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.started = False

    @hookimpl
    def on_step_end(self, step, metrics):
        self.steps.append(step)

    @hookimpl
    def on_run_start(self, model, optimizer, config, output_dir):
        self.started = True

    @hookimpl
    def score_rollouts(self, context, rollout):
        return torch.zeros(rollout.batch.size)


def test_a_plugin_passed_in_code_observes_and_changes_nothing(tmp_path):
    probe = Probe()
    with pytest.warns(UserWarning, match=r"Probe observes the run \(it was passed in code, not named in the run "
                                         r"config's plugins:\): it receives on_step_end and on_estimate alone, and "
                                         r"its on_run_start, score_rollouts are not called"):
        trainer = Trainer(config(tmp_path, "leaf", steps=2), examples(), plugins=[probe], host=host())
    metrics = trainer.run()
    assert probe.steps == [1, 2] and not probe.started
    assert any(m["reward_mean"] != 0 for m in metrics)  # the run's own reward, not the probe's zeros
    assert json.loads((tmp_path / "plugins.json").read_text()) == [{"from_step": 0, "plugins": []}]


def test_too_long_prompts_are_named(tmp_path):
    cfg = config(tmp_path, "grpo", steps=1)
    cfg = replace(cfg, rollout=replace(cfg.rollout, max_prompt_tokens=3))
    with pytest.raises(ConfigError, match=r"example 'clip-\d+': its prompt has \d+ text tokens, more than rollout.max_prompt_tokens=3"):
        Trainer(cfg, examples(), host=host()).run()


class FixedScore:
    """Scores every response ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value

    @hookimpl
    def score_rollouts(self, context, rollout):
        return torch.full((rollout.batch.size,), self.value)


class FailsAtStepEnd:
    @hookimpl
    def on_step_end(self, step, metrics):
        raise ValueError("the tracker is unreachable")


class ChoosesBoundaries:
    @hookimpl
    def select_boundaries(self, batch, params):
        return None


class DoesNothing:
    @hookimpl
    def register_rewards(self, register):
        pass


def named_host() -> PluginHost:
    """The test reward and plugins installed under names (as entry points would be)."""
    return PluginHost.discover(extra_plugins=[
        ("test-rewards", TestRewards()), ("quarter", FixedScore(0.25)), ("half", FixedScore(0.5)),
        ("fails-at-step-end", FailsAtStepEnd()), ("chooses-boundaries", ChoosesBoundaries()),
        ("does-nothing", DoesNothing())], strict=True)


def test_named_plugins_replace_a_stage_the_first_named_first(tmp_path):
    installed = named_host()

    def first_reward(names, directory):
        cfg = replace(config(tmp_path / directory, "grpo", steps=1), plugins=names)
        return Trainer(cfg, examples(), host=installed).run()[0]["reward_mean"]

    assert first_reward(["half", "quarter"], "a") == 0.5
    assert first_reward(["quarter", "half"], "b") == 0.25
    assert first_reward([], "c") not in (0.25, 0.5)  # installed, not named: the run's own reward (vowel share)


def test_a_plugin_failing_in_a_hook_is_named_with_the_hook_and_step(tmp_path):
    cfg = replace(config(tmp_path, "grpo", steps=2, checkpoint_every=1), plugins=["fails-at-step-end"])
    with pytest.raises(PluginStageError, match=r"^plugin 'fails-at-step-end' failed in its on_step_end hook at "
                                               r"step 1: ValueError: the tracker is unreachable$"):
        Trainer(cfg, examples(), host=named_host()).run()


@pytest.mark.parametrize(("name", "message"), [
    ("chooses-boundaries", "implements the estimator stage 'select_boundaries'"),
    ("does-nothing", "implements none of the hooks a run config enables"),
    ("halff", "unknown plugin 'halff': not an installed leaf_plugins entry point nor an importable module. "
              "Did you mean 'half'?"),
    ("json.nonexistent_module", "unknown plugin 'json.nonexistent_module'"),
])
def test_plugins_a_run_config_cannot_enable_are_refused(name, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_plugin(name, named_host())


STUDY = """\
output_dir: {out}
base:
  reward: vowel_share
  plugins: [quarter]
variations:
  - {{label: base plugins, seed: 0}}
  - {{label: two, plugins: [half, quarter]}}
  - {{label: misspelt, plugins: [halff]}}
"""


def test_a_study_names_plugins_in_its_base_and_per_variation(tmp_path):
    from leaf_plugins.studies.config import load_study

    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(out=tmp_path / "out"))
    with pytest.raises(ConfigError) as caught:
        load_study(path, host=named_host())
    line = path.read_text().splitlines()[7]
    errors = [error.strip() for error in str(caught.value).splitlines()[1:]]
    assert errors == [f"{path}:8:{line.index('plugins') + 1}: base.plugins: unknown plugin 'halff': not an installed "
                      f"leaf_plugins entry point nor an importable module. Did you mean 'half'? Installed plugins "
                      f"with run-time hooks: fails-at-step-end, half, quarter"]
    path.write_text(STUDY.format(out=tmp_path / "out").replace("halff", "half"))
    study = load_study(path, host=named_host())
    assert [(run.variation, run.config.plugins) for run in study.runs] == [
        ("base plugins", ["quarter"]), ("two", ["half", "quarter"]), ("misspelt", ["half"])]


class RecordingRollout:
    """Samples with the built-in generate backend and records what each call was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []
        self.texts: list[str] = []

    @hookimpl
    def rollout(self, context):
        from leaf_plugins.core.stages import RolloutRequest
        from leaf_plugins.rollout.sampling import sample_responses

        settings = context.config.rollout
        self.asked.append((context.step, len(context.examples), settings.group_size, settings.temperature,
                           settings.top_p, settings.max_new_tokens))
        rollout = sample_responses(RolloutRequest(context.model, context.loaded, context.inputs, settings.group_size,
                                                  settings.max_new_tokens, settings.temperature, settings.top_p),
                                   backend="generate")
        self.texts.extend(rollout.texts)
        return rollout


def test_held_out_sampling_goes_through_a_named_rollout_plugin(tmp_path):
    from leaf_plugins.evaluation.sampling import Sampling, load_policy, sample_predictions
    from leaf_plugins.training.stage_plugins import rollout_stage

    recorder = RecordingRollout()
    installed = PluginHost.discover(extra_plugins=[("test-rewards", TestRewards()), ("recording", recorder)],
                                    strict=True)
    cfg = replace(config(tmp_path, "grpo"), plugins=["recording"])
    policy = load_policy(cfg.backbone, None, installed)
    runs = sample_predictions(policy, examples(3), Sampling(responses=2, temperature=0.7, top_p=0.8, max_new_tokens=5,
                                                            batch_prompts=2, stage=rollout_stage(cfg, installed)))
    assert recorder.asked == [(1, 2, 2, 0.7, 0.8, 5), (2, 1, 2, 0.7, 0.8, 5)]  # the evaluation's settings
    assert [text for example in zip(*runs) for text in example] == recorder.texts  # prompt-major, runs consecutive
    assert rollout_stage(replace(cfg, plugins=[]), installed) is None
