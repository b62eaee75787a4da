"""Run configs from YAML: every mistake at once, with file:line:col and a did-you-mean."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from leaf_plugins import ConfigError
from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigNotice
from leaf_plugins.training.config import EstimatorConfig, load_train_config

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


SEVERAL = """\
stpes: 20
rollout:
  group_size: eight
estimator:
  name: leaf
  params:
    fork_budgt: 2
"""


def test_every_mistake_is_reported_at_once_the_estimators_parameters_included(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(SEVERAL)
    assert main(["train", str(path), "estimator.params.horizon=eachh", "optim.learning_rate=fast"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"leaf train: error: {path}: 5 errors in the configuration:\n"
        f"  override 'optim.learning_rate=fast': optim.learning_rate: expected float, got 'fast'\n"
        f"  override 'estimator.params.horizon=eachh': estimator.params.horizon: horizon must be one of shortest, "
        f"each; got 'eachh'. Did you mean 'each'?\n"
        f"  {path}:1:1: unknown key 'stpes'. Did you mean 'steps'? Valid keys: output_dir, seed, steps, "
        f"checkpoint_every, keep_checkpoints, sharding, log_rollouts, nonfinite_rewards, threads, reward, "
        f"reward_params, report_to, plugins, backbone, task, estimator, rollout, optim, lora\n"
        f"  {path}:3:3: rollout.group_size: expected int, got 'eight'\n"
        f"  {path}:7:5: estimator.params.fork_budgt: estimator 'leaf' has no parameter 'fork_budgt'. Did you mean "
        f"'fork_budget'? Its parameters: fork_budget, horizon, min_group, normalize, terms\n")


def test_an_unknown_estimator_is_one_error_and_its_parameters_are_not_judged_by_another(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: eleven\nestimator:\n  name: leef\n  params: {fork_budget: 3}\n")
    with pytest.raises(ConfigError) as caught:
        load_train_config(path)
    message = str(caught.value)
    assert "2 errors" in message and f"{path}:3:3: estimator.name: Unknown estimator 'leef'. Did you mean 'leaf'" \
        in message and f"{path}:1:1: steps: expected int, got 'eleven'" in message


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


LEAF_RUN = """\
steps: 10
estimator:
  name: leaf
  params:
    fork_budget: 3
    horizon: each
"""
LEFT_OUT = "left out (parameters given with estimator.name are kept and checked)"


def test_switching_the_estimator_on_the_command_line_leaves_out_the_files_parameters_it_does_not_read(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(LEAF_RUN)
    with pytest.warns(ConfigNotice) as notes:
        config = load_train_config(path, ["estimator.name=grpo"])
    assert config.estimator == EstimatorConfig("grpo", {}, {})  # the run config holds only grpo's parameters
    assert [str(note.message) for note in notes] == [
        f"override 'estimator.name=grpo' switched the estimator to 'grpo', which does not read fork_budget "
        f"({path}:5:5), horizon ({path}:6:5): {LEFT_OUT}"]
    with pytest.warns(ConfigNotice) as notes:
        config = load_train_config(path, ["estimator.name=collision"])
    assert config.estimator.params == {"fork_budget": 3}  # collision reads fork_budget (not horizon)
    assert f"which does not read horizon ({path}:6:5): " in str(notes[0].message) and len(notes) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNotice)  # tree_rloo reads both: nothing to say
        assert load_train_config(path, ["estimator.name=tree_rloo"]).estimator.params == {"fork_budget": 3,
                                                                                        "horizon": "each"}


def test_the_cli_prints_the_switch_as_one_note_and_runs_on(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(LEAF_RUN)
    assert main(["train", str(path), "estimator.name=otb", "--check"]) == 0
    err = capsys.readouterr().err
    assert err == (f"leaf train: note: override 'estimator.name=otb' switched the estimator to 'otb', which does "
                   f"not read fork_budget ({path}:5:5), horizon ({path}:6:5): {LEFT_OUT}\n")


@pytest.mark.parametrize("file, overrides, location, message", [
    (LEAF_RUN, ["estimator.name=grpo", "estimator.params.epss=0.1"], "override 'estimator.params.epss=0.1'",
     "estimator.params.epss: estimator 'grpo' has no parameter 'epss'. Did you mean 'eps'? Its parameters: eps, "
     "scale_rewards, std_floor"),
    (LEAF_RUN, ["estimator.name=grpo", "estimator.params.fork_budget=2"], "override 'estimator.params.fork_budget=2'",
     "estimator.params.fork_budget: estimator 'grpo' has no parameter 'fork_budget' (a parameter of collision, leaf, "
     "tree_otb, tree_rloo). Its parameters: eps, scale_rewards, std_floor"),
    (LEAF_RUN.replace("fork_budget", "fork_budgt"), ["estimator.name=grpo"], "{path}:5:5",
     "estimator.params.fork_budgt: estimator 'grpo' has no parameter 'fork_budgt'. Did you mean 'fork_budget'?"),
    (LEAF_RUN.replace("leaf", "grpo"), [], "{path}:5:5",
     "estimator.params.fork_budget: estimator 'grpo' has no parameter 'fork_budget' (a parameter of"),
    (LEAF_RUN, ["estimator.params.fork_budget=-1"], "override 'estimator.params.fork_budget=-1'",
     "estimator.params.fork_budget: fork_budget must be an integer >= 0, got -1"),
    (LEAF_RUN, ["estimator.params={fork_budget: -4}"], "override 'estimator.params={fork_budget: -4}'",
     "estimator.params.fork_budget: fork_budget must be an integer >= 0, got -4"),
    (LEAF_RUN, ["estimator.params=[unclosed"], "override 'estimator.params=[unclosed'", "the value is not YAML"),
], ids=["misspelled-with-the-name", "another-estimators-with-the-name", "misspelled-in-the-file", "same-file",
        "out-of-range-override", "whole-params-override", "not-yaml"])
def test_estimator_parameter_errors_name_the_place_that_gave_them(tmp_path, file, overrides, location, message):
    path = tmp_path / "run.yaml"
    path.write_text(file)
    with pytest.raises(ConfigError) as caught:
        load_train_config(path, overrides)
    first, *errors = str(caught.value).splitlines()
    assert first == f"{path}: {len(errors)} error{'s' if len(errors) > 1 else ''} in the configuration:"
    assert errors[0].strip().startswith(f"{location.replace('{path}', str(path))}: {message}"), errors


def test_a_path_that_is_no_run_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    listed, scalar = tmp_path / "list.yaml", tmp_path / "scalar.yaml"
    listed.write_text("# runs\n- steps: 1\n- steps: 2\n")
    scalar.write_text("steps\n")
    for path, message in [
        (tmp_path, f"{tmp_path}: is a directory, not a YAML file"),
        (tmp_path / "missing.yaml", f"{tmp_path / 'missing.yaml'}: no such file"),
        (listed, f"{listed}:2:1: the file must hold a mapping of sections (`key: value` lines), not a list"),
        (scalar, f"{scalar}:1:1: the file must hold a mapping of sections (`key: value` lines), not a single "
                 f"value 'steps'"),
    ]:
        assert main(["train", str(path), "--check"]) == 2
        assert capsys.readouterr().err == f"leaf train: error: {message}\n"
    unreadable = tmp_path / "run.yaml"
    unreadable.write_text(LEAF_RUN)
    real = Path.read_bytes

    def denied(self):  # as chmod 000 would for a user other than root (the tests may run as root)
        if self == unreadable:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert main(["train", str(unreadable), "--check"]) == 2
    assert capsys.readouterr().err == f"leaf train: error: {unreadable}: cannot be read: Permission denied\n"


def test_a_quoted_choice_is_a_choice(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text('estimator:\n  name: leaf\n  params: {horizon: "each", normalize: \'token\'}\n')
    assert load_train_config(path).estimator.params == {"horizon": "each", "normalize": "token"}


def test_a_built_in_tasks_options_are_checked_with_the_config_naming_each_culprit(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("task:\n  name: spoken-translation\n  options:\n    size: 12\n    sizee: 3\n")
    with pytest.raises(ConfigError) as error:
        load_train_config(path, ["task.options.workers=many"])
    lines = str(error.value).splitlines()[1:]
    assert lines == [  # overrides first, then the file's lines in order
        "  override 'task.options.workers=many': task.options.workers: workers must be an integer or null, "
        "got 'many'",
        f"  {path}:5:5: task.options.sizee: task 'spoken-translation' has no parameter 'sizee'. Did you mean 'size' "
        f"or 'seed'? Its parameters: cache_dir, seed, size, test_size, validation_size, workers",
    ]
    assert load_train_config(path, ["task.options={size: 12}"]).task.options == {"size": 12}
