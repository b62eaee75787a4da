"""Evaluation split across the processes of a launch: example i's responses are keyed to
i, the processes sample contiguous shares of the batches, and the predictions gathered in
rank order are those one process samples, so rank 0 writes the one-process files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from leaf_plugins.cli import main
from leaf_plugins.evaluation.sampling import Sampling, load_policy, sample_groups, sample_predictions
from training_cases import config, examples

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _free_port() -> str:
    """A port no other launch on this machine uses now (not the launchers' shared 29500)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(config(tmp_path_factory.mktemp("run")).backbone)


def test_predictions_do_not_depend_on_the_batch_size(policy):
    chosen = examples(7)
    by_size = [sample_predictions(policy, chosen, Sampling(responses=2, max_new_tokens=6, batch_prompts=size, seed=3))
               for size in (2, 5)]
    assert by_size[0] == by_size[1]
    assert len(set(by_size[0][0])) > 1  # the examples (same prompt, other audio) are sampled apart


class RecordingStage:
    """A rollout stage that records the batches it is asked for and lets the backend sample."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, list[str]]] = []

    def __call__(self, number, chosen, request):
        self.asked.append((number, [example.id for example in chosen]))
        return None


def test_shares_in_rank_order_are_the_one_process_batches(policy):
    chosen = examples(7)  # 4 batches of 2: shares of 2, 1 and 1 batches
    alone, shares = RecordingStage(), [RecordingStage() for _ in range(3)]
    sampling = Sampling(responses=2, max_new_tokens=4, batch_prompts=2)
    expected = [text for rollout in sample_groups(policy, chosen, replace(sampling, stage=alone))
                for text in rollout.texts]
    texts = [text for rank, stage in enumerate(shares)
             for rollout in sample_groups(policy, chosen, replace(sampling, stage=stage), rank=rank, world=3)
             for text in rollout.texts]
    assert texts == expected
    assert [len(stage.asked) for stage in shares] == [2, 1, 1]
    assert [asked for stage in shares for asked in stage.asked] == alone.asked  # the stage sees the same batches


def _environment(log: Path) -> dict[str, str]:
    log.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "OMP_NUM_THREADS": "1", "EVAL_BATCH_LOG": str(log),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))}


@pytest.mark.slow  # two launches of seconds each
def test_generate_under_two_processes_writes_the_one_process_files(tmp_path, monkeypatch):
    run = tmp_path / "run.yaml"
    run.write_text(f"""\
output_dir: {tmp_path / 'no-run'}
backbone: {{name: tiny-qwen2-audio}}
task: {{name: spoken-translation, options: {{size: 8, validation_size: 1, test_size: 5, cache_dir: {tmp_path}}}}}
plugins: [eval_batch_recorder]
""")
    arguments = ["eval", "generate", str(run), "--split", "test", "--runs", "2", "--max-new-tokens", "6",
                 "--batch-prompts", "2"]
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("EVAL_BATCH_LOG", str(tmp_path / "log-one"))
    (tmp_path / "log-one").mkdir()
    assert main([*arguments, "--out", str(tmp_path / "one")]) == 0
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           _free_port(), "-m", "leaf_plugins.cli", *arguments, "--out", str(tmp_path / "two")],
                          capture_output=True, text=True, env=_environment(tmp_path / "log-two"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = sorted(path.name for path in (tmp_path / "one").iterdir())
    assert one == ["predictions-run0.jsonl", "predictions-run1.jsonl"]
    assert sorted(path.name for path in (tmp_path / "two").iterdir()) == one
    for name in one:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    # the 3 batches of 2, 2 and 1 examples: rank 0 sampled the first two, rank 1 the last,
    # each under the number it has on one process
    asked = {rank: (tmp_path / "log-two" / f"rank{rank}.txt").read_text().splitlines() for rank in (0, 1)}
    alone = (tmp_path / "log-one" / "rank0.txt").read_text().splitlines()
    assert [line.split()[0] for line in alone] == ["1", "2", "3"]
    assert asked == {0: alone[:2], 1: alone[2:]}


@pytest.mark.slow  # a one-step study on one process and under a launch of two
def test_a_study_under_two_processes_writes_the_one_process_predictions(tmp_path, monkeypatch):
    import json

    from leaf_plugins.studies.config import load_study
    from leaf_plugins.studies.runner import run_study

    study = tmp_path / "study.yaml"
    study.write_text(f"""\
output_dir: {tmp_path / 'one'}
base:
  steps: 1
  checkpoint_every: 1
  backbone: {{name: tiny-qwen2-audio}}
  task: {{name: spoken-translation, options: {{size: 8, validation_size: 3, test_size: 1, cache_dir: {tmp_path}}}}}
  rollout: {{group_size: 2, prompts_per_step: 2, max_new_tokens: 6}}
  optim: {{learning_rate: 0.01}}
  lora: {{rank: 4, alpha: 8, dropout: 0.0}}
  plugins: [eval_batch_recorder]
grid:
  estimator.name: [grpo]
seeds: [0]
evaluation: {{split: validation, runs: 2, max_new_tokens: 6, batch_prompts: 1, metrics: [bleu, length]}}
""")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("EVAL_BATCH_LOG", str(tmp_path / "log-one"))
    (tmp_path / "log-one").mkdir()
    run_study(load_study(study))
    done = subprocess.run(  # --multi_gpu selects accelerate's torchrun launcher; on CPU the processes use gloo
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
         "1", "--main_process_port", _free_port(), "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
         "leaf_plugins.cli", "study", str(study),
         f"output_dir={tmp_path / 'two'}"],
        capture_output=True, text=True, env=_environment(tmp_path / "log-two"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    written = {side: sorted(path.relative_to(tmp_path / side) for path in (tmp_path / side).rglob("predictions-run*"))
               for side in ("one", "two")}
    assert len(written["one"]) == 2 + 2  # the starting model's and the run's, 2 decoding runs each
    assert written["two"] == written["one"]
    for path in written["one"]:
        assert (tmp_path / "two" / path).read_bytes() == (tmp_path / "one" / path).read_bytes(), path
    assert len(list((tmp_path / "two").rglob("evaluation.json"))) == 2
    # the run's 3 held-out batches of 1 (its plugin's rollout hook is asked for them; the
    # training steps' calls name training examples): rank 0 sampled 2, rank 1 the last
    held_out = {json.loads(line)["id"] for line in next((tmp_path / "one").rglob("runs/*/*/predictions-run0.jsonl"))
                .read_text().splitlines()}

    def evaluated(log: Path) -> list[str]:
        return [line for line in log.read_text().splitlines() if set(line.split()[1:]) <= held_out]

    alone = evaluated(tmp_path / "log-one" / "rank0.txt")
    assert [line.split()[0] for line in alone] == ["1", "2", "3"]
    assert [evaluated(tmp_path / "log-two" / f"rank{rank}.txt") for rank in (0, 1)] == [alone[:2], alone[2:]]
