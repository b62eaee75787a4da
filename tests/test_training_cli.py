"""`leaf train CONFIG` from the example YAML files, on each tiny backbone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leaf_plugins.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "runs"


@pytest.mark.parametrize("backbone", ["tiny-qwen2-audio", "tiny-granite-speech"])
def test_leaf_train_runs_from_yaml_and_resumes(backbone, tmp_path, capsys):
    overrides = [f"output_dir={tmp_path / 'run'}", "steps=2", "checkpoint_every=1", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", "rollout.max_new_tokens=8", f"task.options.cache_dir={tmp_path / 'cache'}",
                 "task.options.size=8", "task.options.validation_size=2", "task.options.test_size=2"]
    assert main(["train", str(CONFIGS / f"{backbone}.yaml"), *overrides]) == 0
    assert "done: reward" in capsys.readouterr().out
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert main(["train", str(CONFIGS / f"{backbone}.yaml"), *overrides[:1], "steps=3", *overrides[2:]]) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # resumed, not restarted
    out = capsys.readouterr().out
    assert f"resuming from {tmp_path / 'run' / 'checkpoint-00000002'} (step 2 of 3; 1 to go)\n" in out
    assert out.count("resuming from") == 1


def test_check_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("estimator:\n  name: leef\n")
    assert main(["train", str(bad), "--check"]) == 2
    assert "Did you mean 'leaf'" in capsys.readouterr().err
