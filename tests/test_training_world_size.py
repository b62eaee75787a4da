"""A run on 1, 2 or 3 processes (gloo on the CPU; ``torchrun``, ``accelerate launch``,
two rendezvous "nodes") trains what one process trains: the same rollouts, metrics and
adapter, for every built-in estimator, with uneven shares, dropped groups, several
clipped updates per rollout in mini-batches on a learning-rate schedule, and the current
recipes' settings (dynamic sampling's extra rounds among them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.training.whole_step import check_world, prompt_share

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPOSITORY = Path(__file__).resolve().parents[1]
ESTIMATORS = ("grpo", "leaf", "collision", "full_tree", "otb", "tree_rloo", "tree_otb")
RUNS = (*ESTIMATORS, "dropped", "updates", "micro_batches", "recipe")
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1", "LEAF_PLUGINS_STRICT": "1"}

RELATIVE = 1e-4
"""Largest relative difference of a logged metric between process counts. The responses
are the same tokens; what differs is float32 rounding: a prompt's logits computed in a
batch of another shape (about 1e-7 relative), and DDP summing the shares' gradients in
another order, which moves the weights by about 1e-7 of their change per step. Measured
on these runs: at most 1.1e-5 (the loss at step 2 of the dropped-group run)."""

ADAPTER_SHARE = 0.01
"""Largest distance between the final adapters of two process counts, as a share of the
distance training moved the adapter. Measured: under 1e-4 (the same rounding)."""


def test_shares_are_contiguous_cover_the_step_and_differ_by_at_most_one():
    for prompts in range(1, 20):
        for world in range(1, prompts + 1):
            shares = [prompt_share(prompts, rank, world) for rank in range(world)]
            assert [p for share in shares for p in share] == list(range(prompts))  # rank order is step order
            assert max(map(len, shares)) - min(map(len, shares)) <= 1 and min(map(len, shares)) >= 1
    assert [len(prompt_share(7, rank, 3)) for rank in range(3)] == [3, 2, 2]


def test_a_process_without_a_prompt_is_refused_with_what_to_change():
    check_world(3, 3)
    with pytest.raises(ConfigError) as error:
        check_world(2, 3)
    message = str(error.value)
    assert "rollout.prompts_per_step=2" in message and "3 processes" in message
    assert "at least 3" in message and "at most 2 processes" in message


def close(found: float, expected: float, scale: float = 0.0) -> bool:
    """Within ``RELATIVE`` of ``expected``, or of ``scale`` where that is larger."""
    return abs(found - expected) <= RELATIVE * max(abs(expected), scale)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_training(found: Path, expected: Path) -> None:
    """The metrics of every step and the final adapter of two runs' output directories."""
    ours, theirs = read_metrics(found / "metrics.jsonl"), read_metrics(expected / "metrics.jsonl")
    assert [m["step"] for m in ours] == [m["step"] for m in theirs] and ours
    for mine, reference in zip(ours, theirs):
        assert mine["groups_dropped"] == reference["groups_dropped"]
        for key in ("reward_mean", "advantage_abs_mean", "kl", "grad_norm", "learning_rate", "clip_fraction",
                    "entropy", "sampling_rounds", "zero_std_groups", "truncated_fraction"):
            assert close(mine[key], reference[key]), (found, mine["step"], key, mine[key], reference[key])
        # the first step's loss is a sum of ± advantages times ratios of 1 that cancels in exact
        # arithmetic: its value is rounding (about 1e-8), so it is compared on the scale of its terms
        assert close(mine["loss"], reference["loss"], scale=reference["advantage_abs_mean"]), (found, mine["step"])


def assert_same_adapter(found: dict, expected: dict) -> None:
    start, end, reference = expected["start"], found["end"], expected["end"]
    assert end.keys() == reference.keys() and end
    moved = sum(float((reference[k] - start[k]).pow(2).sum()) for k in reference) ** 0.5
    apart = sum(float((end[k] - reference[k]).pow(2).sum()) for k in reference) ** 0.5
    assert moved > 0 and apart <= ADAPTER_SHARE * moved, (apart, moved)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launched(command: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, env=ENVIRONMENT, timeout=timeout, cwd=REPOSITORY)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("one-process")
    launched([sys.executable, str(SCRIPTS / "world_size_runs.py"), str(output)])
    return output


@pytest.mark.slow  # three launches of 9 short runs each (about 2 minutes on 2 cores)
@pytest.mark.parametrize("launcher", ["accelerate-2", "torchrun-3"])
def test_every_estimator_trains_the_same_on_several_processes(one_process, tmp_path, launcher):
    if launcher == "accelerate-2":  # the shipped DDP config (MULTI_GPU: without CUDA, gloo on the CPU)
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                  str(REPOSITORY / "configs" / "accelerate" / "ddp-4gpu.yaml"), "--num_processes", "2",
                  "--mixed_precision", "no", "--dynamo_backend", "no"]
        world = 2
    else:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
                  "--master_port", str(free_port())]
        world = 3
    launched([*launch, str(SCRIPTS / "world_size_runs.py"), str(tmp_path)])
    for run in RUNS:
        assert_same_training(tmp_path / run, one_process / run)
        assert_same_adapter(torch.load(tmp_path / run / "adapter.pt"), torch.load(one_process / run / "adapter.pt"))
        checksums = {json.loads((tmp_path / run / f"checksum-{rank}.json").read_text()) for rank in range(world)}
        assert len(checksums) == 1, run  # every rank ends with the same adapter
        # every group of every step is logged once, with the one-process run's responses
        logged = [json.loads(line) for line in (tmp_path / run / "rollouts.jsonl").read_text().splitlines()]
        expected = [json.loads(line) for line in (one_process / run / "rollouts.jsonl").read_text().splitlines()]
        assert [(g["step"], g["group_id"], g["tokens"]) for g in logged] == \
            [(g["step"], g["group_id"], g["tokens"]) for g in expected]
    # two prompts a micro-batch, cut at other places by the shares (3, 2, 2 or 4, 3), with dropout on: what one
    # process trains with one prompt a micro-batch
    assert_same_training(tmp_path / "micro_batches", one_process / "leaf")
    assert_same_adapter(torch.load(tmp_path / "micro_batches" / "adapter.pt"),
                        torch.load(one_process / "leaf" / "adapter.pt"))
    dropped = read_metrics(tmp_path / "dropped" / "metrics.jsonl")
    assert [m["groups_dropped"] for m in dropped] == [2.0, 1.0]  # the third process's whole share at step 1
    recipe = read_metrics(tmp_path / "recipe" / "metrics.jsonl")
    assert max(m["sampling_rounds"] for m in recipe) > 1  # the rounds after the first were sampled and compared


@pytest.mark.slow  # the one-process fixture's runs
def test_micro_batches_change_nothing_but_rounding_with_dropout_on(one_process):
    """``optim.micro_batch_prompts`` is a memory setting: LoRA dropout's masks are keyed by
    each row, not drawn per micro-batch, so 2 prompts a micro-batch train what 1 does."""
    assert_same_training(one_process / "micro_batches", one_process / "leaf")
    assert_same_adapter(torch.load(one_process / "micro_batches" / "adapter.pt"),
                        torch.load(one_process / "leaf" / "adapter.pt"))


@pytest.mark.slow  # two short CLI runs and one refused launch
def test_two_rendezvous_nodes_train_what_one_process_trains(tmp_path):
    """``torchrun --nnodes 2 --nproc_per_node 1`` with a c10d rendezvous on localhost (two
    launches that meet, as two machines would), sharing the output directory. One step:
    from the second on, a response of the built-in task can part from the one-process
    run's where a keyed uniform lands within the weights' rounding of a token boundary
    (measured about 1 draw in 10^4 after a step; docs/scaling-out.md)."""
    arguments = ["train", "configs/runs/tiny-qwen2-audio.yaml", "steps=1", "rollout.prompts_per_step=6",
                 "rollout.group_size=4", "rollout.max_new_tokens=8", "checkpoint_every=1", "threads=1",
                 "estimator.name=tree_otb"]
    launched([sys.executable, "-m", "leaf_plugins.cli", *arguments, f"output_dir={tmp_path / 'one'}"])
    endpoint = f"127.0.0.1:{free_port()}"
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "leaf-test",
            "-m", "leaf_plugins.cli", *arguments, f"output_dir={tmp_path / 'nodes'}"]
    nodes = [subprocess.Popen(node, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENVIRONMENT,
                              cwd=REPOSITORY) for _ in range(2)]
    outputs = [process.communicate(timeout=900) for process in nodes]
    assert [process.returncode for process in nodes] == [0, 0], [err[-3000:] for _, err in outputs]
    assert_same_training(tmp_path / "nodes", tmp_path / "one")
    assert sorted(p.name for p in (tmp_path / "nodes").glob("checkpoint-*")) == \
        sorted(p.name for p in (tmp_path / "one").glob("checkpoint-*"))
    # more processes than prompts: refused before any model loads, naming what to change
    refused = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--master_port", str(free_port()), "-m", "leaf_plugins.cli", *arguments,
                              "rollout.prompts_per_step=1", f"output_dir={tmp_path / 'refused'}"],
                             capture_output=True, text=True, env=ENVIRONMENT, timeout=600, cwd=REPOSITORY)
    assert refused.returncode != 0
    assert "rollout.prompts_per_step=1 is smaller than the 2 processes" in refused.stderr
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()
