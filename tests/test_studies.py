"""Studies: file checking with locations, expansion into runs, results over seeds, and a
study interrupted in the middle resuming to the same table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from leaf_plugins import hookimpl
from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError, ConfigNotice
from leaf_plugins.studies.config import load_study
from leaf_plugins.studies.results import seed_interval
from leaf_plugins.studies.runner import run_study
from leaf_plugins.training.config import EstimatorConfig

STUDIES = Path(__file__).resolve().parents[1] / "configs" / "studies"

BAD = """\
output_dir: out
seedz: [0]
base:
  stepz: 3
  estimator: {name: leaf}
grid:
  estimator.nme: [leaf]
  estimator.params.fork_budget: 2
  reward: [sentence_bleu, sentense_bleu]
variations:
  - {label: A, optim.learning_rat: 0.1}
evaluation:
  metrics: [bleu, bleurt]
"""


def test_every_mistake_is_reported_at_once_with_file_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError) as caught:
        load_study(path)
    message = str(caught.value)
    expected = [
        f"{path}:2:1: unknown key 'seedz'. Did you mean 'seeds'?",
        f"{path}:4:3: unknown key 'base.stepz'. Did you mean 'steps'?",
        f"{path}:7:3: grid: unknown key 'estimator.nme'. Did you mean 'name'?",
        f"{path}:8:3: grid: estimator.params.fork_budget: expected a non-empty list of values, got 2",
        f"{path}:9:27: base.reward: Unknown reward 'sentense_bleu'",
        f"{path}:11:16: variations[0]: unknown key 'optim.learning_rat'. Did you mean 'learning_rate'?",
        f"{path}:13:3: evaluation.metrics: unknown metric 'bleurt'",
    ]
    for line in expected:
        assert line in message, (line, message)
    assert message.count("sentense_bleu") == 1  # reported once, not once per run


def test_estimator_parameters_are_reported_with_the_other_mistakes(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("output_dir: out\nbase:\n  stpes: 20\n  rollout: {group_size: eight}\n"
                    "  estimator: {name: leaf, params: {fork_budgt: 2}}\ngrid:\n  estimator.params.horizon: [each, eech]\n")
    with pytest.raises(ConfigError) as caught:
        load_study(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: 4 errors in the configuration:")
    for line in [f"{path}:3:3: unknown key 'base.stpes'. Did you mean 'steps'?",
                 f"{path}:4:13: base.rollout.group_size: expected int, got 'eight'",
                 f"{path}:5:36: variation 'horizon=each': estimator.params.fork_budgt: estimator 'leaf' has no parameter "
                 f"'fork_budgt'. Did you mean 'fork_budget'?",  # once, though both variations have it
                 f"{path}:7:36: variation 'horizon=eech': estimator.params.horizon: horizon must be one of shortest, each; "
                 f"got 'eech'. Did you mean 'each'?"]:
        assert line in message, (line, message)


def test_cli_check_exits_2_and_names_the_file(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    assert main(["study", str(path), "--check"]) == 2
    assert f"{path}:2:1" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_study_validates(path, capsys):
    assert main(["study", str(path), "--check"]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.slow  # a warm start and two short runs on the built-in task (about 40 s on 2 cores)
def test_the_dapo_study_runs_end_to_end_on_the_built_in_task(tmp_path, capsys):
    """configs/studies/dapo-grpo-vs-leaf.yaml as shipped (its base includes the DAPO
    recipe), made small by overrides: warm start, both estimators, evaluation, table."""
    small = f"{{size: 12, validation_size: 4, test_size: 2, cache_dir: {tmp_path / 'cache'}}}"
    assert main(["study", str(STUDIES / "dapo-grpo-vs-leaf.yaml"), f"output_dir={tmp_path / 'study'}",
                 f"warm_start.output_dir={tmp_path / 'warm'}", "warm_start.epochs=1",
                 f"warm_start.task.options={small}", f"base.task.options={small}", "base.steps=2",
                 "base.checkpoint_every=2", "base.rollout.max_new_tokens=8", "base.rollout.prompts_per_step=2",
                 "seeds=[0]", "evaluation.max_new_tokens=8"]) == 0
    table = (tmp_path / "study" / "results.md").read_text()
    assert "| estimator=grpo | 1 |" in table and "| estimator=leaf | 1 |" in table
    resolved = (tmp_path / "study" / "runs" / "estimator=leaf" / "seed-0" / "config.yaml").read_text()
    assert "clip_epsilon_high: 0.28" in resolved and "dynamic_sampling: true" in resolved  # from the recipe
    metrics = [json.loads(line) for line in
               (tmp_path / "study" / "runs" / "estimator=leaf" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all("sampling_rounds" in m for m in metrics)


def test_variations_times_grid_times_seeds(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("""\
output_dir: out
base: {steps: 3, estimator: {name: leaf}}
variations:
  - {label: GA only, estimator.params.terms: global}
  - {label: both, estimator.params.terms: both}
grid:
  estimator.params.fork_budget: [1, 4]
seeds: [0, 5]
""")
    study = load_study(path, ["base.steps=7"])
    assert len(study.runs) == 2 * 2 * 2
    assert study.variations == ["GA only, fork_budget=1", "GA only, fork_budget=4", "both, fork_budget=1",
                                "both, fork_budget=4"]
    run = study.runs[3]  # GA only, fork_budget=4, seed 5
    assert (run.variation, run.seed) == ("GA only, fork_budget=4", 5)
    assert run.config.estimator.params == {"terms": "global", "fork_budget": 4}
    assert (run.config.seed, run.config.steps, run.config.log_rollouts) == (5, 7, True)
    assert run.directory == Path("out/runs/ga-only-fork_budget=4/seed-5")
    assert len({r.directory for r in study.runs}) == 8


def test_a_warm_start_becomes_the_runs_starting_model(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("""\
warm_start: {output_dir: ws, backbone: {name: tiny-granite-speech}}
base: {steps: 3}
""")
    study = load_study(path)
    assert study.warm_start.output_dir == "ws"
    assert (study.runs[0].config.backbone.name, study.runs[0].config.backbone.path) == ("tiny-granite-speech",
                                                                                      str(Path("ws/model")))


def test_seed_interval():
    mean, low, high = seed_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and 1.0 <= low < 2.0 < high <= 3.0
    assert seed_interval([4.0, 4.0]) == (4.0, 4.0, 4.0)
    mean, low, high = seed_interval([4.0])
    assert mean == 4.0 and math.isnan(low) and math.isnan(high)


class InterruptAtCall:
    """Ctrl-C at the n-th step end of the whole study."""

    def __init__(self, call: int) -> None:
        self.call, self.calls = call, 0

    @hookimpl
    def on_step_end(self, step, metrics):
        self.calls += 1
        if self.calls == self.call:
            raise KeyboardInterrupt


def tiny_study(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""\
output_dir: {tmp_path / name}
base:
  steps: 3
  checkpoint_every: 1
  backbone: {{name: tiny-qwen2-audio}}
  task: {{name: spoken-translation, options: {{size: 8, validation_size: 2, test_size: 2, cache_dir: {tmp_path / 'cache'}}}}}
  rollout: {{group_size: 4, prompts_per_step: 2, max_new_tokens: 8}}
  optim: {{learning_rate: 0.01}}
  lora: {{rank: 4, alpha: 8, dropout: 0.0}}
grid:
  estimator.name: [grpo, leaf]
seeds: [0, 1]
evaluation: {{split: validation, max_new_tokens: 8, metrics: [bleu, length]}}
""")
    return path


def test_a_study_interrupted_in_the_middle_resumes_to_the_same_table(tmp_path):
    straight = load_study(tiny_study(tmp_path, "straight"))
    table = run_study(straight)[0].read_text()
    interrupted = load_study(tiny_study(tmp_path, "interrupted"))
    with pytest.raises(KeyboardInterrupt):
        run_study(interrupted, plugins=[InterruptAtCall(3 + 3 + 2)])  # in the third run, after its step 2
    finished = sorted(p.parent.name + "/" + p.parent.parent.name for p in (tmp_path / "interrupted").rglob("evaluation.json"))
    assert len(finished) == 1 + 2  # the starting model and two runs
    resumed = run_study(interrupted)[0].read_text()
    assert resumed.replace("interrupted", "straight") == table
    assert sum(line.startswith("| estimator=") for line in table.splitlines()) == 2 + 1  # and leaf vs grpo
    assert "items only: 2 seeds too few for a seed-level interval" in table  # not a CI over two seeds
    runs = [json.loads(p.read_text()) for p in (tmp_path / "straight" / "runs").rglob("evaluation.json")]
    assert len(runs) == 4 and all(0.0 <= run["usable_fire_rate"] <= run["fire_rate"] <= 1.0 for run in runs)
    assert all(run["bleu_low"] <= run["bleu_run0"] <= run["bleu_high"] for run in runs)
    assert all(run["delta_bleu_low"] <= run["delta_bleu"] <= run["delta_bleu_high"] for run in runs)
    assert (tmp_path / "straight" / "learning_curves.png").stat().st_size > 0
    assert (tmp_path / "straight" / "study.resolved.yaml").exists()
    changed = load_study(tiny_study(tmp_path, "straight"), ["base.steps=4"])
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(config.steps: 3 -> 4\)"):
        run_study(changed)  # never reuses runs made with other settings


SWITCHED = """\
output_dir: out
base:
  steps: 3
  estimator:
    name: leaf
    params: {fork_budget: 4, horizon: each}
grid:
  estimator.name: [grpo, leaf, collision]
seeds: [0, 1]
"""


def test_a_grid_over_the_estimator_leaves_out_the_base_parameters_each_does_not_read_with_one_notice(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(SWITCHED)
    with pytest.warns(ConfigNotice) as notes:
        study = load_study(path)
    params = {run.variation: run.config.estimator.params for run in study.runs}
    assert params == {"estimator=grpo": {}, "estimator=leaf": {"fork_budget": 4, "horizon": "each"},
                      "estimator=collision": {"fork_budget": 4}}
    assert [str(note.message) for note in notes] == [  # one notice for the study, not one per run
        f"variation 'estimator=grpo' ({path}:8:20) switched the estimator to 'grpo', which does not read "
        f"fork_budget ({path}:6:14), horizon ({path}:6:30); variation 'estimator=collision' ({path}:8:32) switched "
        f"the estimator to 'collision', which does not read horizon ({path}:6:30): left out (parameters given "
        f"with estimator.name are kept and checked)"]
    with pytest.warns(ConfigNotice) as notes:
        study = load_study(path, ["base.estimator.name=otb", "grid={}"])
    assert [run.config.estimator for run in study.runs] == [EstimatorConfig("otb", {}, {})] * 2
    assert str(notes[0].message).startswith("override 'base.estimator.name=otb' switched the estimator to 'otb'")


VARIED = """\
output_dir: out
base:
  steps: 3
  estimator:
    name: leaf
    params: {fork_budget: 4}
variations:
  - {label: grpo with B, estimator.name: grpo, estimator.params.fork_budget: 2}
  - {label: leaf, estimator.name: leaf, estimator.params.min_group: 1}
"""


def test_a_variations_own_estimator_parameters_are_checked_where_given(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(VARIED)
    lines = VARIED.splitlines()
    with pytest.raises(ConfigError) as caught:
        load_study(path)
    errors = [line.strip() for line in str(caught.value).splitlines()[1:]]
    assert errors == [
        f"{path}:8:{lines[7].index('estimator.params.fork_budget') + 1}: variation 'grpo with B': "
        f"estimator.params.fork_budget: estimator 'grpo' has no parameter 'fork_budget' (a parameter of collision, "
        f"leaf, tree_otb, tree_rloo). Its parameters: eps, scale_rewards, std_floor",
        f"{path}:9:{lines[8].index('estimator.params.min_group') + 1}: variation 'leaf': estimator.params.min_group: "
        f"min_group must be an integer >= 2 (singletons are never nodes), got 1",
    ]


def test_a_study_files_errors_come_in_line_order(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("""\
output_dir: out
grid:
  estimator.nme: [leaf]
variations:
  - {label: A, optim.learning_rat: 0.1}
seedz: [0]
base:
  stepz: 3
""")
    with pytest.raises(ConfigError) as caught:
        load_study(path, ["evaluation.metrics=[bleurt]"])
    located = [line.strip().split(": ")[0] for line in str(caught.value).splitlines()[1:]]
    assert located == ["override 'evaluation.metrics=[bleurt]'", f"{path}:3:3", f"{path}:5:16", f"{path}:6:1",
                       f"{path}:8:3"]


@pytest.mark.parametrize("text, message", [
    ("- output_dir: out\n", "{path}:1:1: the file must hold a mapping of sections (`key: value` lines), not a list"),
    (None, "{path}: is a directory, not a YAML file"),
], ids=["list", "directory"])
def test_a_study_path_that_is_no_study_file_is_one_line_naming_it(tmp_path, capsys, text, message):
    path = tmp_path / "study.yaml" if text is not None else tmp_path
    if text is not None:
        path.write_text(text)
    assert main(["study", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == f"leaf study: error: {message.replace('{path}', str(path))}\n"
    assert "Traceback" not in err and "CommentedSeq" not in err


def test_table_of_a_study_with_no_finished_run_says_so(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nbase: {{steps: 3}}\ngrid: {{estimator.name: [grpo, leaf]}}\n")
    assert main(["study", str(path), "--table"]) == 2
    assert capsys.readouterr().err == (
        f"leaf study: error: {path}: none of its 2 runs has finished yet (a finished run has evaluation.json in its "
        f"directory under {tmp_path / 'out'}), so there is no table: run `leaf study {path}` first\n")
    assert not (tmp_path / "out" / "results.md").exists()


def test_held_out_predictions_are_sampled_by_the_runs_rollout_backend(tmp_path, monkeypatch):
    """A study whose runs set ``rollout.backend`` evaluates with that backend too: the
    evaluation's rollouts (those sampled for no training step) go to ``generate``, and its
    starting model's predictions are those of ``sample_predictions`` with the same backend
    and seed (the same as the static loop's: both draw the same keyed tokens)."""
    from dataclasses import replace

    from leaf_plugins.evaluation.predictions import read_predictions
    from leaf_plugins.rollout import backends as rollout_backend
    from leaf_plugins.evaluation.sampling import load_policy, sample_predictions
    from leaf_plugins.studies.evaluate import BASELINE, PREDICTIONS, held_out_sampling
    from leaf_plugins.training.config import task_examples

    evaluated = []
    sample = rollout_backend.GenerateBackend.sample
    monkeypatch.setattr(rollout_backend.GenerateBackend, "sample",
                        lambda self, request: evaluated.append(request.context is None) or sample(self, request))
    study = load_study(tiny_study(tmp_path, "generate"), ["base.rollout.backend=generate", "seeds=[0]",
                                                         "grid={estimator.name: [grpo]}", "base.steps=1"])
    run_study(study)
    assert any(evaluated)  # rollouts without a training step: the evaluation's
    written = read_predictions(next((tmp_path / "generate" / BASELINE).glob(f"*/{PREDICTIONS}"))).predictions
    config = study.runs[0].config
    settings = study.config.evaluation
    held_out = task_examples(config.task, settings.split)
    policy = load_policy(config.backbone)
    sampled = {backend: sample_predictions(policy, held_out,
                                           held_out_sampling(settings, replace(config.rollout, backend=backend)))[0]
               for backend in ("generate", "static")}
    assert written == sampled["generate"] == sampled["static"]


@pytest.mark.slow  # a 2-run study on one process and under a launch of three (about 2 minutes on 2 cores)
def test_a_study_on_three_processes_trains_what_one_process_trains(tmp_path):
    """Under ``accelerate launch --num_processes 3``: 4 prompts a step in shares of 2, 1
    and 1, two prompts a micro-batch, LoRA dropout on. Every run logs the one-process
    metrics and ends with its adapter up to rounding; its training time is one figure."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from test_training_world_size import assert_same_training, free_port

    overrides = ["seeds=[0]", "base.rollout.prompts_per_step=4", "base.optim.micro_batch_prompts=2",
                 "base.lora.dropout=0.1", "base.keep_checkpoints=all"]
    study = tiny_study(tmp_path, "one")
    assert main(["study", str(study), *overrides]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "3", "--num_machines",
         "1", "--main_process_port", str(free_port()), "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
         "leaf_plugins.cli", "study", str(study), *overrides, f"output_dir={tmp_path / 'three'}"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for run in ("estimator=grpo", "estimator=leaf"):
        one, three = (tmp_path / side / "runs" / run / "seed-0" for side in ("one", "three"))
        assert_same_training(three, one)
        final = "checkpoint-00000003/adapter/adapter_model.safetensors"
        expected, found, first = (load_file(str(path)) for path in (
            one / final, three / final, one / "checkpoint-00000001/adapter/adapter_model.safetensors"))
        moved = sum(float((expected[k] - first[k]).pow(2).sum()) for k in expected) ** 0.5
        apart = sum(float((found[k] - expected[k]).pow(2).sum()) for k in expected) ** 0.5
        assert moved > 0 and apart <= 0.01 * moved, (run, apart, moved)  # float32 sums in another order
        assert len((three / "train_seconds.txt").read_text().split()) == 1  # the main process's wall time alone
