"""A run records the environment its numbers depend on, and a resume under another one
says what changed."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from leaf_plugins.training.environment import ENVIRONMENT, EnvironmentChangedWarning, environment, record_environment


def test_the_environment_is_recorded_once_and_a_resume_under_another_warns(tmp_path):
    record_environment(tmp_path)
    held = json.loads((tmp_path / ENVIRONMENT).read_text())
    assert held == environment() and held["threads"] == torch.get_num_threads()
    assert held["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record_environment(tmp_path)  # the same environment: silent
    held["threads"] += 3
    (tmp_path / ENVIRONMENT).write_text(json.dumps(held))
    with pytest.warns(EnvironmentChangedWarning, match=rf"threads: {held['threads']} -> {torch.get_num_threads()}\)"):
        record_environment(tmp_path)
    assert json.loads((tmp_path / ENVIRONMENT).read_text())["threads"] == held["threads"]  # the start is kept
