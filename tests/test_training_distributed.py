"""Training under `accelerate launch` with 2 CPU processes (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, host, step_gradient

SCRIPT = Path(__file__).resolve().parent / "scripts" / "two_process_step.py"


@pytest.mark.slow  # a subprocess run of seconds
def test_two_processes_share_the_prompts_and_end_with_identical_adapters(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        # --multi_gpu selects accelerate's torchrun launcher; without CUDA the trainer runs on CPU with gloo
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["prompts"] for r in ranks] == [2, 2]  # the step's 4 prompts, split between the ranks
    first, second = ranks[0]["lora"], ranks[1]["lora"]
    assert first.keys() == second.keys() and first
    for name in first:
        assert torch.equal(first[name], second[name]), name
    # the step really changed the adapter (LoRA B starts at zero)
    assert any(bool(value.abs().sum() > 0) for name, value in first.items() if "lora_B" in name)
    assert (tmp_path / "run" / "checkpoint-00000001").is_dir()
    # the step's gradient is the one process's gradient of the whole step (paper Eq. 1's
    # token mean over all 4 prompts), although the ranks' shares differ in length
    single = Trainer(config(tmp_path / "single", "leaf", steps=1, checkpoint_every=1), examples(), host=host())
    expected = step_gradient(single, examples()[:4])
    for rank in ranks:
        assert rank["gradient"].keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(rank["gradient"][name], expected[name], rtol=1e-4, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow  # a subprocess run of seconds
def test_fsdp2_generation_gathers_the_sharded_layers_once_per_rollout(tmp_path):
    """accelerate 1.15 runs FSDP only on accelerators (on CPU it falls back to one plain
    process), so FSDP2 is applied by hand here, on gloo. Both rollout backends."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           str(SCRIPT.parent / "fsdp_generation.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        torch.testing.assert_close(result["forced"], result["unsharded_forced"], rtol=0, atol=1e-6)
        gradient, expected = result["gradient"], result["unsharded_gradient"]
        assert gradient.keys() == expected.keys() and any(bool(g.abs().sum() > 0) for g in expected.values())
        # the same kernels on gathered weights: measured 0 difference (ATEN_CPU_CAPABILITY=avx2 and
        # default, 1 thread); the reordered float32 sum's bound of test_loss_aggregation as margin
        for name in expected:
            torch.testing.assert_close(gradient[name], expected[name], rtol=0,
                                       atol=1e-5 * float(expected[name].abs().max()), msg=lambda m, name=name: f"{name}: {m}")
        modules = result["sharded_modules"]
        for backend, runs in result["backends"].items():
            for sharded in (runs["once"], runs["per_forward"], runs["root_sharded"]):
                assert torch.equal(sharded.tokens, runs["unsharded"].tokens), backend
                torch.testing.assert_close(sharded.logprobs, runs["unsharded"].logprobs, rtol=0, atol=1e-6)
            assert runs["gathers_once"] == modules, backend  # one all-gather per layer per rollout
        steps = result["backends"]["generate"]["unsharded"].width
        # generate without the gathering: every layer at every token; the static loop gathers once itself
        assert result["backends"]["generate"]["gathers_per_forward"] >= modules * steps
        assert result["backends"]["static"]["gathers_per_forward"] == modules
