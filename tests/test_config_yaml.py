"""Run configs from YAML: every mistake at once, with file:line:col and a did-you-mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from leaf_plugins import ConfigError
from leaf_plugins.training.config import load_train_config

BAD = """\
steps: 10
backbone:
  name: tiny-qwen-audio
estimator:
  name: leaf
  parms:
    fork_budget: 2
rollout:
  group_size: eight
"""


def test_three_mistakes_reported_at_once_with_locations(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError) as caught:
        load_train_config(path)
    message = str(caught.value)
    assert "3 errors" in message
    assert f"{path}:3:3: backbone.name: Unknown backbone 'tiny-qwen-audio'. Did you mean 'tiny-qwen2-audio'" in message
    assert f"{path}:6:3: unknown key 'estimator.parms'. Did you mean 'params'?" in message
    assert f"{path}:9:3: rollout.group_size: expected int, got 'eight'" in message


def test_overrides_apply_and_are_named_when_wrong(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 10\nestimator:\n  name: leaf\n")
    config = load_train_config(path, ["estimator.name=grpo", "optim.learning_rate=0.001", "rollout.group_size=4"])
    assert (config.estimator.name, config.optim.learning_rate, config.rollout.group_size) == ("grpo", 0.001, 4)
    assert config.lora.rank == 64 and config.rollout.top_p == 0.9  # paper defaults where unset
    with pytest.raises(ConfigError, match=r"override 'estimator.nmae=grpo': unknown key 'estimator.nmae'\. Did you mean 'name'"):
        load_train_config(path, ["estimator.nmae=grpo"])


def test_yaml_syntax_errors_have_a_location(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("steps: 10\nbackbone: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+:\d+: YAML syntax error"):
        load_train_config(path)


def test_example_run_config_validates():
    config = load_train_config(Path(__file__).resolve().parents[1] / "configs" / "runs" / "tiny-qwen2-audio.yaml")
    assert (config.backbone.name, config.task.name, config.estimator.name) == ("tiny-qwen2-audio", "spoken-translation", "leaf")
    assert config.estimator.params == {"fork_budget": 2}
