"""``config.yaml`` in a run's directory: the resolved config, a valid run config, and
the guard against resuming a run with settings that train something else."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.studies.evaluate import training_summary
from leaf_plugins.training.config import load_train_config
from leaf_plugins.training.run_config import check_resumed_config, check_same_backbone, run_setting
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host

TINY_RUN = ["steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
            "checkpoint_every=1", "threads=1", "lora.rank=4", "lora.alpha=8"]


@pytest.fixture(scope="module")
def tree_otb_run(tmp_path_factory) -> Path:
    """`leaf train` of the shipped tiny config with tree_otb and one parameter set."""
    output = tmp_path_factory.mktemp("run") / "tree-otb"
    assert main(["train", "configs/runs/tiny-qwen2-audio.yaml", *TINY_RUN, "estimator.name=tree_otb",
                 "estimator.params.tree_weight=0.5", f"output_dir={output}"]) == 0
    return output


def test_the_run_writes_its_resolved_config_naming_the_estimator_and_every_parameter(tree_otb_run):
    written = YAML(typ="safe", pure=True).load((tree_otb_run / "config.yaml").read_text())
    assert written["estimator"]["name"] == "tree_otb"
    params = written["estimator"]["params"]
    assert params["tree_weight"] == 0.5 and params["fork_budget"] == 2  # given, and from the shipped file
    assert params["ridge"] == 0.025 and params["horizon"] == "shortest"  # defaults filled in
    assert written["optim"]["learning_rate"] == 1e-4 and written["optim"]["updates_per_rollout"] == 1
    assert written["optim"]["max_grad_norm"] is None and written["steps"] == 1
    loaded = load_train_config(tree_otb_run / "config.yaml")  # a valid run config: the same run
    assert loaded.estimator.name == "tree_otb" and loaded.estimator.params["tree_weight"] == 0.5
    assert loaded.output_dir == str(tree_otb_run)


def test_the_written_config_checks_and_a_run_directory_stands_for_it(tree_otb_run, capsys):
    assert main(["train", str(tree_otb_run / "config.yaml"), "--check"]) == 0
    assert capsys.readouterr().out.strip() == f"{tree_otb_run / 'config.yaml'}: OK"
    assert main(["train", str(tree_otb_run), "--check", "steps=5"]) == 0  # raising steps is the same run


def test_resuming_with_settings_that_train_something_else_is_refused_naming_them(tree_otb_run, capsys):
    assert main(["train", str(tree_otb_run), "--check", "optim.learning_rate=1e-3", "optim.lr_schedule=cosine"]) == 2
    error = capsys.readouterr().err
    assert "would train something else: optim.learning_rate: 0.0001 -> 0.001; optim.lr_schedule: 'constant' -> " \
           "'cosine'." in error
    assert f"leaf train {tree_otb_run / 'config.yaml'}" in error  # what to run instead
    assert main(["train", str(tree_otb_run), "estimator.params.tree_weight=0.25"]) == 2  # refused before training
    assert "estimator.params.tree_weight: 0.5 -> 0.25" in capsys.readouterr().err
    assert main(["train", str(tree_otb_run), "--check", "output_dir=elsewhere"]) == 0  # another run: no checkpoint


def test_the_trainer_refuses_the_resume_before_the_model_loads(tmp_path):
    settings = config(tmp_path / "run", "leaf", steps=1)
    Trainer(settings, examples(), host=host()).run()
    changed = dataclasses.replace(settings, estimator=dataclasses.replace(settings.estimator, name="grpo"),
                                  steps=3, checkpoint_every=1, keep_checkpoints="all")
    with pytest.raises(ConfigError, match=r"estimator.name: 'leaf' -> 'grpo'") as error:
        Trainer(changed, examples(), host=host())
    assert "steps" not in str(error.value).split("something else:")[1]  # steps, checkpoints: free to change
    check_resumed_config(tmp_path / "run", dataclasses.replace(settings, steps=9, threads=1), host())


def test_evaluation_refuses_another_backbone_and_reads_the_runs_fork_budget(tree_otb_run):
    settings = load_train_config(tree_otb_run / "config.yaml")
    check_same_backbone(tree_otb_run, settings)
    other = dataclasses.replace(settings, backbone=dataclasses.replace(settings.backbone, seed=3))
    with pytest.raises(ConfigError, match=r"trained on backbone.seed=0, and this config has backbone.seed=3"):
        check_same_backbone(tree_otb_run, other)
    assert run_setting(tree_otb_run, "estimator.params.fork_budget") == 2
    assert run_setting(tree_otb_run, "estimator.params.missing", "absent") == "absent"
    assert run_setting(tree_otb_run.parent, "steps", "no file") == "no file"


def test_a_studys_fork_fire_rates_use_the_runs_own_fork_budget(tmp_path):
    """Without ``evaluation.fork_budget`` the forkability summary takes the run's B (here
    1, not the default 2) from its config.yaml; a study that sets one overrides it."""
    from leaf_plugins.studies.config import EvaluationSettings

    settings = config(tmp_path / "run", "leaf", steps=1)
    settings.log_rollouts = True
    settings.estimator = dataclasses.replace(settings.estimator, params={"fork_budget": 1})
    Trainer(settings, examples(), host=host()).run()
    own = training_summary(tmp_path / "run", EvaluationSettings())
    assert own == training_summary(tmp_path / "run", EvaluationSettings(fork_budget=1))
    assert own["fire_rate"] != training_summary(tmp_path / "run", EvaluationSettings(fork_budget=4))["fire_rate"]
