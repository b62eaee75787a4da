"""Interrupted runs resume exactly where they stopped."""

from __future__ import annotations

import json

import pytest
import torch

from leaf_plugins import hookimpl
from leaf_plugins.training.lora import lora_state
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host


def final_adapter(output_dir, steps: int, plugins=()) -> dict[str, torch.Tensor]:
    settings = config(output_dir, "leaf", steps=steps)
    settings.log_rollouts = True
    trainer = Trainer(settings, examples(), plugins=plugins, host=host())
    trainer.run()
    return lora_state(trainer.policy)


def test_a_rerun_resumes_from_the_checkpoint_and_ends_where_an_uninterrupted_run_ends(tmp_path):
    straight = final_adapter(tmp_path / "straight", steps=4)
    final_adapter(tmp_path / "resumed", steps=2)  # stops after step 2 (a checkpoint)
    resumed = final_adapter(tmp_path / "resumed", steps=4)  # the same run, asked to go on
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.allclose(straight[name], resumed[name], atol=1e-6), name
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    assert [p.name for p in (tmp_path / "resumed").glob("checkpoint-*")] == ["checkpoint-00000004"]


class InterruptAfter:
    """Raises KeyboardInterrupt (as Ctrl-C would) once a step has ended."""

    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def on_step_end(self, step, metrics):
        if step == self.step:
            raise KeyboardInterrupt


def test_ctrl_c_saves_a_checkpoint_and_the_rerun_completes_the_run(tmp_path):
    straight = final_adapter(tmp_path / "straight", steps=4)
    with pytest.raises(KeyboardInterrupt):
        final_adapter(tmp_path / "interrupted", steps=4, plugins=[InterruptAfter(3)])
    assert [p.name for p in (tmp_path / "interrupted").glob("checkpoint-*")] == ["checkpoint-00000003"]
    resumed = final_adapter(tmp_path / "interrupted", steps=4)
    for name in straight:
        assert torch.allclose(straight[name], resumed[name], atol=1e-6), name


class CrashAt:
    """Raises an error (a crash: no checkpoint is saved) once a step has ended."""

    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def on_step_end(self, step, metrics):
        if step == self.step:
            raise RuntimeError("crash")


def test_after_a_crash_the_logs_are_cut_back_to_the_checkpoint_and_match_a_straight_run(tmp_path):
    final_adapter(tmp_path / "straight", steps=4)
    with pytest.raises(RuntimeError):
        final_adapter(tmp_path / "crashed", steps=4, plugins=[CrashAt(3)])  # checkpoint-2 only; step 3 logged
    logged = [json.loads(line)["step"] for line in (tmp_path / "crashed" / "rollouts.jsonl").read_text().splitlines()]
    assert logged == [1] * 4 + [2] * 4 + [3] * 4  # 4 prompts (groups) per step
    final_adapter(tmp_path / "crashed", steps=4)
    for log in ("metrics.jsonl", "rollouts.jsonl"):
        straight = [json.loads(line) for line in (tmp_path / "straight" / log).read_text().splitlines()]
        resumed = [json.loads(line) for line in (tmp_path / "crashed" / log).read_text().splitlines()]
        assert [row["step"] for row in resumed] == [row["step"] for row in straight]
        if log == "rollouts.jsonl":  # the same samples, rewards and surprisal, step by step
            assert resumed == straight
