"""``sharding: fsdp2`` (FSDP2 applied by hand, 2 gloo processes) trains what one process
trains, writes checkpoints with a peft-format adapter, resumes bit for bit, and a kill of
a rank mid-write leaves only complete checkpoints; ``keep_checkpoints`` keeps the newest N."""

from __future__ import annotations


import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model

from leaf_plugins import ConfigError
from leaf_plugins.training.checkpoint import load_checkpoint, save_checkpoint
from leaf_plugins.training.config import load_train_config
from leaf_plugins.training.lora import load_lora, lora_state
from leaf_plugins.training.sharding import shard_policy
from leaf_plugins.training.step_metrics import reproducible
from leaf_plugins.training.whole_step import micro_batches_per_process
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from sharded_training import UPDATES  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "scripts" / "sharded_training.py"


def torchrun(output: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(SCRIPT),
                           str(output), mode], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, list[dict], list[str]]:
    """The script's runs: ``killed`` first, then ``runs`` (which continues the killed run);
    with what the kill left in the killed run's directory."""
    output = tmp_path_factory.mktemp("sharded")
    killed = torchrun(output, "killed")
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    left = sorted(p.name for p in (output / "killed").iterdir() if p.name.startswith(("checkpoint-", ".partial-")))
    done = torchrun(output, "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    return output, [torch.load(output / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)], left


def distance(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The Euclidean distance between two adapters (all their tensors as one vector)."""
    assert first.keys() == second.keys()
    return sum(float((first[name] - second[name]).double().norm() ** 2) for name in first) ** 0.5


@pytest.mark.slow  # two torchrun launches and a one-process run: about a minute on 2 cores
def test_a_sharded_two_process_run_trains_what_one_process_trains(runs, tmp_path):
    _, ranks, _ = runs
    assert [rank["sharded"]["world"] for rank in ranks] == [2, 2]
    for name, value in ranks[0]["sharded"]["adapter"].items():  # the gathered adapter is the same on both ranks
        assert torch.equal(value, ranks[1]["sharded"]["adapter"][name]), name
    single = Trainer(config(tmp_path / "single", "leaf", steps=4, checkpoint_every=2), examples(), host=host())
    start = lora_state(single.policy)
    one = single.run()
    final = lora_state(single.policy)
    moved = distance(final, start)
    assert moved > 0
    sharded = ranks[0]["sharded"]
    for other, expected in (("one process", one), ("DDP on 2 processes", ranks[0]["ddp"]["metrics"])):
        # the same sampled tokens; float32 sums in another order (gradients summed over 2
        # processes) move the weights by ~1e-7 relative a step: measured 1.2e-5 at step 4
        # against one process, 0 against DDP
        assert len(sharded["metrics"]) == len(expected) == 4
        for step, (mine, theirs) in enumerate(zip(sharded["metrics"], expected), start=1):
            assert abs(mine["loss"] - theirs["loss"]) <= 1e-4 * abs(theirs["loss"]), (other, step)
            # the same tokens score the same rewards; their float32 mean may be summed in another order
            assert mine["reward_mean"] == pytest.approx(theirs["reward_mean"], rel=1e-6), (other, step)
    # measured 0.02% of the distance moved against one process, 0 against DDP
    assert distance(sharded["adapter"], final) <= 0.01 * moved
    assert distance(sharded["adapter"], ranks[0]["ddp"]["adapter"]) <= 0.01 * moved


@pytest.mark.slow
def test_sharded_clipped_updates_in_mini_batches_train_what_unsharded_ones_train(runs):
    """Two passes of two mini-batches, each gradient clipped by its global norm (over the
    shards: a DTensor norm), on a cosine schedule with weight decay; against DDP on the
    same 2 processes. (Against one process: tests/test_training_world_size.py.)"""
    _, ranks, _ = runs
    sharded, unsharded = ranks[0]["updates"], ranks[0]["updates_ddp"]
    assert len(sharded["metrics"]) == len(unsharded["metrics"]) == 4
    for step, (mine, theirs) in enumerate(zip(sharded["metrics"], unsharded["metrics"]), start=1):
        # the same sums but for the gradient's reduce-scatter against DDP's all-reduce,
        # amplified by Adam over 16 optimizer steps: measured (AVX-512 and AVX2) at most
        # 1.8e-5 relative on grad_norm and kl, and 9.9e-5 on the loss of step 3, a sum of
        # terms near 0.1 that cancels to -0.0096 (the bound's tightest margin)
        for key in ("loss", "kl", "grad_norm", "clip_fraction", "learning_rate", "reward_mean"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-9), (step, key)
    assert max(m["grad_norm"] for m in unsharded["metrics"]) > UPDATES["max_grad_norm"]  # the clip acted
    moved = distance(unsharded["adapter"], unsharded["start"])
    # measured 8.6e-6 of the distance moved: the same rounding
    assert moved > 0 and distance(sharded["adapter"], unsharded["adapter"]) <= 1e-3 * moved


@pytest.mark.slow
def test_a_sharded_checkpoint_holds_a_peft_adapter_the_shards_and_every_ranks_rng(runs):
    output, ranks, _ = runs
    run = output / "sharded"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("checkpoint-", ".partial-"))) == [
        "checkpoint-00000002", "checkpoint-00000004"]  # keep_checkpoints: all
    checkpoint = run / "checkpoint-00000004"
    assert {p.name for p in checkpoint.iterdir()} >= {"adapter", "state.pt", "rng-rank0.pt", "rng-rank1.pt", "trained"}
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    assert (state["step"], state["world_size"], state["sharding"]) == (4, 2, "fsdp2")
    assert len(list((checkpoint / "trained").glob("*.distcp"))) == 2  # each rank wrote its shards
    # peft reads the adapter as it reads an unsharded run's: the trained weights, bit for bit
    backbone = host().backbones.get("tiny-qwen2-audio")
    loaded = load_lora(backbone.load(seed=0).model, str(checkpoint / "adapter"))
    adapter = {name: value for name, value in loaded.named_parameters() if "lora_" in name}  # loaded frozen
    final = ranks[0]["sharded"]["adapter"]
    assert adapter.keys() == final.keys()
    for name, value in adapter.items():
        assert torch.equal(value, final[name]), name


@pytest.mark.slow
def test_a_sharded_run_stopped_and_continued_ends_bit_for_bit_where_an_uninterrupted_run_ends(runs):
    output, ranks, _ = runs
    straight = ranks[0]["sharded"]
    for continued in ("resumed", "after_kill"):
        for rank in ranks:
            for name, value in straight["adapter"].items():
                assert torch.equal(rank[continued]["adapter"][name], value), (continued, name)
        logged = [json.loads(line) for line in (output / continued.replace("after_kill", "killed") /
                                                "metrics.jsonl").read_text().splitlines()]
        expected = [json.loads(line) for line in (output / "sharded" / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in logged] == [1, 2, 3, 4]
        for row, same in zip(logged, expected):
            assert reproducible(row) == reproducible(same)
    assert [p.name for p in (output / "resumed").iterdir() if p.name.startswith("checkpoint-")] == [
        "checkpoint-00000004"]  # keep_checkpoints: 1 (the default)


@pytest.mark.slow
def test_a_rank_killed_while_a_checkpoint_is_written_leaves_only_complete_checkpoints(runs):
    """Rank 1 was killed after writing its shards of checkpoint 4: the write was never
    renamed, so checkpoint 2 is the newest; the re-run resumed from it (trained steps 3
    and 4 again), removed the partial write and ended where the uninterrupted run ends
    (the test above)."""
    output, ranks, left = runs
    assert left == [".partial-00000004", "checkpoint-00000002"]
    assert len(ranks[0]["after_kill"]["metrics"]) == 2
    assert sorted(p.name for p in (output / "killed").iterdir() if p.name.startswith(("checkpoint-", ".partial-"))) == [
        "checkpoint-00000004"]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.mark.parametrize("keep, kept", [(1, [4]), (2, [3, 4]), ("all", [1, 2, 3, 4])])
def test_keep_checkpoints_keeps_the_newest_n_or_all(tmp_path, keep, kept):
    torch.manual_seed(0)
    model = get_peft_model(Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, model, optimizer, keep=keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{step:08d}" for step in kept]


def test_a_checkpoint_restores_this_processs_rng_states(tmp_path):
    torch.manual_seed(0)
    model = get_peft_model(Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
    path = save_checkpoint(tmp_path, 1, model, optimizer)
    assert (path / "rng-rank0.pt").is_file()
    drawn = (random.random(), torch.rand(3))
    load_checkpoint(path, model, optimizer)
    again = (random.random(), torch.rand(3))
    assert drawn[0] == again[0] and torch.equal(drawn[1], again[1])


def test_keep_checkpoints_and_sharding_are_validated_with_their_locations(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("keep_checkpoints: 0\nsharding: fsdp\n")
    with pytest.raises(ConfigError) as caught:
        load_train_config(path)
    message = str(caught.value)
    assert (f"{path}:1:1: keep_checkpoints: must be an integer >= 1 (the newest N checkpoints are kept) or 'all' "
            f"(none is deleted), got 0") in message
    assert f"{path}:2:1: sharding: must be one of none, fsdp2" in message
    path.write_text("steps: 3\n")
    assert load_train_config(path, ["keep_checkpoints=all"]).keep_checkpoints == "all"
    assert load_train_config(path, ["keep_checkpoints=3", "sharding=fsdp2"]).keep_checkpoints == 3


def test_every_process_runs_as_many_micro_batches_as_the_one_with_the_most():
    """Under FSDP2 every forward pass gathers weights from all processes: a process with
    fewer micro-batches in a mini-batch makes up the count with stand-ins of weight 0."""
    assert micro_batches_per_process(4, 2, 2, 1, 0) == 1  # 2 prompts each, one micro-batch each
    assert micro_batches_per_process(4, 3, 2, 1, 0) == 2  # prompts 0-1 | 2-3 of the micro-batches 0-2 | 3-5
    assert micro_batches_per_process(4, 2, 2, 2, 0) == 1  # mini-batches {0, 2} and {1, 3}: one of each per process
    assert micro_batches_per_process(6, 1, 2, 2, 0) == 2  # positions 0, 2 | 4 of mini-batch 0
    assert micro_batches_per_process(7, 1, 3, 1, 0) == 3  # shares 3, 2, 2
    assert micro_batches_per_process(2, 1, 3, 2, 1) == 1  # a process with none of the mini-batch: one stand-in


def test_sharding_a_single_process_run_is_refused_with_the_launch_command():
    with pytest.raises(ConfigError, match=r"this run has one: launch it with `torchrun --nproc_per_node N"):
        shard_policy(torch.nn.Linear(2, 2), Accelerator(cpu=True))
