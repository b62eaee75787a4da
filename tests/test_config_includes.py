"""``include:``: a run config or a study's base filled in from recipe files, what the
including file sets winning, errors named in the file that gave them; the shipped
recipes load and set what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from leaf_plugins import ConfigError
from leaf_plugins.studies.config import load_study
from leaf_plugins.training.config import load_train_config

REPOSITORY = Path(__file__).resolve().parents[1]
RECIPES = REPOSITORY / "configs" / "recipes"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_including_file_wins_then_the_later_include_sections_merge_lists_whole(tmp_path):
    write(tmp_path / "recipes" / "first.yaml", "optim: {clip_epsilon: 0.1, kl_coefficient: 0.5, dual_clip: 3.0}\n"
                                               "reward: [{name: sentence_bleu}, {name: exact_match}]\n")
    write(tmp_path / "recipes" / "second.yaml", "optim: {clip_epsilon: 0.3, entropy_coefficient: 0.01}\n"
                                                "rollout: {group_size: 4}\n")
    run = write(tmp_path / "runs" / "run.yaml", "include: [../recipes/first.yaml, ../recipes/second.yaml]\n"
                                                "optim: {learning_rate: 0.001, kl_coefficient: 0.0}\n"
                                                "reward: sentence_bleu\n")
    config = load_train_config(run)
    assert config.optim.learning_rate == 0.001 and config.optim.kl_coefficient == 0.0  # the file's own
    assert config.optim.clip_epsilon == 0.3 and config.optim.entropy_coefficient == 0.01  # the later include
    assert config.optim.dual_clip == 3.0 and config.rollout.group_size == 4  # merged in from either
    assert config.reward == "sentence_bleu"  # a value set by the file is taken whole, list or not


def test_an_error_in_an_included_value_names_the_included_file(tmp_path):
    recipe = write(tmp_path / "recipe.yaml", "optim:\n  clip_epsilon_hihg: 0.28\n  kl_in: rewrad\n")
    run = write(tmp_path / "run.yaml", "steps: 2\ninclude: recipe.yaml\n")
    with pytest.raises(ConfigError) as error:
        load_train_config(run)
    message = str(error.value)
    assert f"{recipe}:2:3: unknown key 'optim.clip_epsilon_hihg'. Did you mean 'clip_epsilon_high'" in message
    assert f"{recipe}:3:3: optim.kl_in: must be one of loss, reward, got 'rewrad'. Did you mean 'reward'?" in message


def test_a_missing_or_circular_include_is_named_at_its_key(tmp_path):
    run = write(tmp_path / "run.yaml", "steps: 2\ninclude: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=rf"{run}:2:1: include 'nowhere.yaml': no such file"):
        load_train_config(run)
    write(tmp_path / "a.yaml", "include: b.yaml\n")
    write(tmp_path / "b.yaml", "include: a.yaml\n")
    with pytest.raises(ConfigError, match=r"include 'a.yaml' includes itself \(.*a.yaml -> .*b.yaml -> .*a.yaml\)"):
        load_train_config(tmp_path / "a.yaml")
    bad = write(tmp_path / "bad.yaml", "include: {file: a.yaml}\n")
    with pytest.raises(ConfigError, match=rf"{bad}:1:1: include must name a file or a list of files"):
        load_train_config(bad)


def test_a_study_base_includes_a_recipe_and_its_variations_override_it(tmp_path):
    study = write(tmp_path / "studies" / "study.yaml", f"""\
output_dir: {tmp_path / 'out'}
base:
  include: {RECIPES / 'dapo.yaml'}
  steps: 2
grid:
  optim.clip_epsilon_high: [0.28, 0.4]
seeds: [0]
""")
    planned = load_study(study).runs
    assert [run.config.optim.clip_epsilon_high for run in planned] == [0.28, 0.4]
    assert all(run.config.rollout.dynamic_sampling and run.config.optim.kl_coefficient == 0.0 for run in planned)
    broken = write(tmp_path / "broken.yaml", "optim: {kl_estimator: k4}\n")
    study.write_text(study.read_text().replace(str(RECIPES / "dapo.yaml"), str(broken)))
    with pytest.raises(ConfigError, match=rf"{broken}:1:\d+: .*kl_estimator"):
        load_study(study)


@pytest.mark.parametrize("recipe, expected", [
    ("paper-grpo", {"optim.clip_epsilon": 0.2, "optim.kl_coefficient": 0.02, "optim.kl_estimator": "k3",
                    "optim.loss_aggregation": "token_mean", "rollout.dynamic_sampling": False}),
    ("dapo", {"optim.clip_epsilon_high": 0.28, "optim.kl_coefficient": 0.0, "rollout.dynamic_sampling": True,
              "rollout.overlong": "penalty"}),
    ("dr-grpo", {"optim.loss_aggregation": "constant", "optim.kl_coefficient": 0.0}),
    ("gspo", {"optim.importance_sampling_level": "sequence", "optim.clip_epsilon": 3e-4,
              "optim.clip_epsilon_high": 4e-4, "optim.loss_aggregation": "sequence_mean"}),
])
def test_each_shipped_recipe_loads_into_the_built_in_run_and_sets_what_it_says(tmp_path, recipe, expected):
    run = write(tmp_path / "run.yaml", (REPOSITORY / "configs" / "runs" / "tiny-qwen2-audio.yaml").read_text()
                + f"include: {RECIPES / (recipe + '.yaml')}\n")
    config = load_train_config(run)
    for dotted, value in expected.items():
        section, name = dotted.split(".")
        assert getattr(getattr(config, section), name) == value, dotted
    assert config.estimator.name == "leaf"  # a recipe leaves the estimator to the run
