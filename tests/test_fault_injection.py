"""Kill -9 at any instant loses nothing: ``leaf train`` killed with SIGKILL at points
across a run (generation, scoring, the update, log writes, checkpoint writes, the log
rewrite of a resume), then re-run, ends with the adapter, metrics and rollout log of an
uninterrupted run; a study killed mid-run resumes to the same table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fault_injection import POINTS, run_leaf
from leaf_plugins.training.checkpoint import latest_checkpoint
from leaf_plugins.training.step_metrics import reproducible
from test_studies import tiny_study

pytestmark = pytest.mark.slow

STEPS = 4

# Each chain is one run directory killed again and again (every kill in a process that
# resumed from the previous kill), then run to the end. The n-th occurrences are chosen so
# that the kills fall in every step, before and after the checkpoints of steps 2 and 4.
CHAINS = {
    "writes": [("sampling", 5), ("metrics.write", 1), ("checkpoint.adapter", 1), ("checkpoint.rename", 1),
               ("optimizer.step", 3), ("log.rewrite", 1), ("rollouts.write", 2), ("log.rewrite", 2),
               ("checkpoint.prune", 1)],
    "compute": [("scoring", 2), ("estimate", 3), ("backward", 3), ("sampling", 9), ("optimizer.step", 2),
                ("metrics.write", 2), ("backward", 4), ("optimizer.step", 1), ("rollouts.write", 1)],
}
KILLS = sum(len(chain) for chain in CHAINS.values())


def run_config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""\
output_dir: {tmp_path / name}
steps: {STEPS}
checkpoint_every: 2
log_rollouts: true
backbone: {{name: tiny-qwen2-audio}}
task:
  name: spoken-translation
  options: {{size: 12, validation_size: 2, test_size: 2, cache_dir: {tmp_path / 'cache'}}}
estimator: {{name: leaf}}
rollout: {{group_size: 4, prompts_per_step: 2, max_new_tokens: 8}}
optim: {{learning_rate: 0.01}}
lora: {{rank: 4, alpha: 8, dropout: 0.0}}
""")
    return path


def outcome(directory: Path, steps: int = STEPS) -> tuple[dict[str, torch.Tensor], list[dict], list[dict]]:
    """The final adapter, the metrics (without wall times) and the rollout log of a run."""
    found = latest_checkpoint(directory)
    assert found is not None and found.name == f"checkpoint-{steps:08d}"
    adapter = load_file(str(found / "adapter" / "adapter_model.safetensors"))
    metrics = [reproducible(json.loads(line))
               for line in (directory / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (directory / "rollouts.jsonl").read_text().splitlines()]
    return adapter, metrics, rollouts


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("straight")
    assert run_leaf(["train", str(run_config(tmp_path, "run"))]) == 0
    return tmp_path, outcome(tmp_path / "run")


def test_every_kill_point_is_exercised():
    # "evaluate": the study test below; "checkpoint.saved" (a SIGKILL there equals one before the next step)
    # is where test_interrupts.py sends SIGINT
    assert {point for chain in CHAINS.values() for point, _ in chain} == set(POINTS) - {"evaluate", "checkpoint.saved"}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_kill_9_at_every_point_then_resume_ends_as_an_uninterrupted_run(straight, chain):
    tmp_path, (adapter, metrics, rollouts) = straight
    config = run_config(tmp_path, chain)
    for point, n in CHAINS[chain]:
        assert run_leaf(["train", str(config)], point, n) == -9, f"{point} #{n} was not reached"
        assert not list((tmp_path / chain).glob(".*.tmp")) or point == "log.rewrite"
    assert run_leaf(["train", str(config)]) == 0
    got_adapter, got_metrics, got_rollouts = outcome(tmp_path / chain)
    assert got_adapter.keys() == adapter.keys()
    for name in adapter:
        assert torch.equal(got_adapter[name], adapter[name]), name  # bit-identical
    assert got_metrics == metrics
    assert got_rollouts == rollouts
    assert [m["step"] for m in got_metrics] == list(range(1, STEPS + 1))


def study_file(tmp_path: Path, name: str) -> Path:
    """The tiny study of the study tests, shortened: 2 steps, one seed."""
    path = tiny_study(tmp_path, name)
    path.write_text(path.read_text().replace("steps: 3", "steps: 2").replace("seeds: [0, 1]", "seeds: [0]"))
    return path


STUDY_KILLS = [("optimizer.step", 3), ("evaluate", 1)]  # run 2's first step; then (resumed) before its evaluation


def test_a_study_killed_mid_run_resumes_to_the_table_of_an_uninterrupted_study(tmp_path):
    assert run_leaf(["study", str(study_file(tmp_path, "straight"))]) == 0
    killed = study_file(tmp_path, "killed")
    for point, n in STUDY_KILLS:
        assert run_leaf(["study", str(killed)], point, n) == -9, f"{point} #{n} was not reached"
    assert run_leaf(["study", str(killed)]) == 0
    for table in ("results.csv", "results.md"):
        got = (tmp_path / "killed" / table).read_text().replace("killed.yaml", "straight.yaml")
        assert got == (tmp_path / "straight" / table).read_text()
    for run in ("estimator=grpo", "estimator=leaf"):
        (adapter, *logs), (want_adapter, *want_logs) = (outcome(tmp_path / name / "runs" / run / "seed-0", steps=2)
                                                       for name in ("killed", "straight"))
        assert logs == want_logs
        assert all(torch.equal(adapter[key], want_adapter[key]) for key in want_adapter)
