"""Runs on several processes (gloo on the CPU, ``torchrun``) that end early the ways real
runs do, launched through ``leaf train`` as a user launches them, with a stage plugin
from outside the repository (``scripts/fault_plugin.py``) whose policy answers the
step's first prompt with one token:

* one-token micro-batches on one process and not on the others train, under DDP and
  FSDP2, what one process trains;
* SIGINT to the launch's process group and SIGTERM to ``torchrun`` alone stop every
  process at one point within seconds, say "interrupted" once, save the last logged
  step, and the same command resumes;
* a plugin that raises on one process stops the run with its error said once and no
  traceback, the checkpoints as they were;
* after all of it the run ends bit-identical to an uninterrupted one;
* rollouts that cannot form one step (group ids repeated across processes, per-token
  fields on one process only) are refused with one clear error;
* a sharded run resumes unsharded, and on another number of processes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leaf_plugins.training.step_metrics import reproducible

from test_training_world_size import assert_same_training, free_port, read_metrics

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1", "LEAF_PLUGINS_STRICT": "1",
               "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(REPOSITORY), os.environ.get("PYTHONPATH", "")])}
STEPS = 18
RUN = ["train", "configs/runs/tiny-qwen2-audio.yaml", "rollout.prompts_per_step=3", "rollout.group_size=4",
       "rollout.max_new_tokens=8", "checkpoint_every=3", "keep_checkpoints=all", "threads=1",
       "plugins=[fault_plugin]", "optim.learning_rate=0.001", "lora.dropout=0.1", f"steps={STEPS}"]

ADAPTER_SHARE = 0.01
"""Largest distance between the final adapters of two launches that differ in process
count or sharding, as a share of the distance the adapter moved after the first
checkpoint: the same tokens, float32 sums in another order (about 1e-5 measured)."""

STOP_SECONDS = 20
"""How long every process of an interrupted launch may take to stop and exit."""


def command(processes: int, output: Path, *overrides: str) -> list[str]:
    """``leaf train`` of the run on ``processes`` processes (torchrun from 2 on)."""
    launch = [sys.executable, "-m", "leaf_plugins.cli"] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
        str(free_port()), "-m", "leaf_plugins.cli"]
    return [*launch, *RUN, f"output_dir={output}", *overrides]


def launched(argv: list[str], environment: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env={**ENVIRONMENT, **(environment or {})},
                          timeout=timeout, cwd=REPOSITORY)


def finished(argv: list[str]) -> None:
    done = launched(argv)
    assert done.returncode == 0, done.stderr[-4000:]


def final_adapter(output: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(output / f"checkpoint-{step:08d}" / "adapter" / "adapter_model.safetensors"))


def distance(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys() and first
    return sum(float((first[name] - second[name]).double().norm() ** 2) for name in first) ** 0.5


def assert_same_adapter(found: Path, expected: Path) -> None:
    """The final adapter of ``found`` within ``ADAPTER_SHARE`` of the move of ``expected``'s
    adapter from its first checkpoint."""
    moved = distance(final_adapter(expected), final_adapter(expected, 3))
    assert moved > 0 and distance(final_adapter(found), final_adapter(expected)) <= ADAPTER_SHARE * moved


def untimed(output: Path) -> list[dict]:
    return [reproducible(row)
            for row in read_metrics(output / "metrics.jsonl")]


def traceback_through_leaf_plugins(text: str) -> bool:
    """Whether a Python traceback in ``text`` passes through this package's code (the
    launcher's own traceback, through torch, does not count)."""
    package = f"{os.sep}leaf_plugins{os.sep}"
    return any(line.lstrip().startswith('File "') and package in line for line in text.splitlines())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The uninterrupted runs: one process, 2 processes (DDP), 2 processes sharded."""
    output = tmp_path_factory.mktemp("faults")
    finished(command(1, output / "one"))
    finished(command(2, output / "ddp"))
    finished(command(2, output / "fsdp2", "sharding=fsdp2"))
    return output


def test_a_one_token_micro_batch_on_one_process_trains_what_one_process_trains(runs):
    for launch in ("ddp", "fsdp2"):
        assert_same_training(runs / launch, runs / "one")
        assert_same_adapter(runs / launch, runs / "one")
    assert read_metrics(runs / "one" / "metrics.jsonl")[0]["response_tokens_mean"] < 8  # the one-token prompt


class Launch:
    """A ``leaf train`` launch in a process group of its own, as a terminal starts one."""

    def __init__(self, argv: list[str], environment: dict | None = None) -> None:
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**ENVIRONMENT, **(environment or {})}, cwd=REPOSITORY,
                                        start_new_session=True)

    def wait_for(self, path: Path, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert self.process.poll() is None, self.process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, f"{path} did not appear"
            time.sleep(0.02)

    def ended(self, timeout: float) -> tuple[int, str, float]:
        """Its exit status, its output (carriage returns as line ends) and how long it took."""
        started = time.monotonic()
        text, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, text.replace("\r", "\n"), time.monotonic() - started


def newest_step(output: Path) -> int:
    return max(int(path.name.split("-")[1]) for path in output.glob("checkpoint-*"))


def assert_stopped_cleanly(output: Path, text: str, seconds: float, name: str) -> None:
    assert seconds <= STOP_SECONDS, (seconds, text[-3000:])
    assert text.count("interrupted") == 1, text[-3000:]
    assert f"leaf train: interrupted ({name}); kept {output}/checkpoint-" in text
    assert not traceback_through_leaf_plugins(text), text[-3000:]
    assert not list(output.glob(".partial-*"))
    assert newest_step(output) == read_metrics(output / "metrics.jsonl")[-1]["step"]  # the last logged step


def test_ctrl_c_sigterm_and_a_failing_process_stop_every_process_and_the_run_resumes_bit_identical(runs, tmp_path):
    """One run directory: SIGINT to the whole process group (a terminal's Ctrl-C, which
    torchrun relays to its workers) a seeded moment after its first checkpoint; resumed,
    SIGTERM to torchrun alone (a scheduler's preemption) after the next checkpoint;
    resumed, process 1's scorer fails two steps on; then the same command, without the
    fault, trains to the end: the metrics and adapter of the uninterrupted launch."""
    output, rng = tmp_path / "run", random.Random(56)
    launch = Launch(command(2, output))
    launch.wait_for(output / "checkpoint-00000003")
    time.sleep(rng.uniform(0.0, 0.3))  # a few steps of this run at most: a moment inside one
    os.killpg(launch.process.pid, signal.SIGINT)
    code, text, seconds = launch.ended(STOP_SECONDS + 40)
    assert code != 0
    assert_stopped_cleanly(output, text, seconds, "SIGINT")

    reached = newest_step(output)
    launch = Launch(command(2, output))
    launch.wait_for(output / f"checkpoint-{(reached // 3 + 1) * 3:08d}")
    time.sleep(rng.uniform(0.0, 0.3))  # a few steps of this run at most: a moment inside one
    launch.process.send_signal(signal.SIGTERM)  # torchrun alone, which relays it to its workers
    code, text, seconds = launch.ended(STOP_SECONDS + 40)
    assert code != 0
    assert_stopped_cleanly(output, text, seconds, "SIGTERM")

    reached = newest_step(output)
    assert reached + 2 <= STEPS, reached
    saved = {path.name: path.stat().st_mtime_ns for path in (output / f"checkpoint-{reached:08d}").rglob("*")}
    launch = Launch(command(2, output), {"LEAF_TEST_FAIL_RANK": "1", "LEAF_TEST_FAIL_STEP": str(reached + 2)})
    code, text, seconds = launch.ended(60)
    assert code != 0 and seconds <= 60
    message = (f"leaf train: error on process 1 of 2: plugin 'fault_plugin' failed in its score_rollouts hook at "
               f"step {reached + 2}: RuntimeError: the scorer's service is unreachable from process 1")
    assert text.count("the scorer's service is unreachable") == 1 and message in text, text[-3000:]
    assert not traceback_through_leaf_plugins(text), text[-3000:]
    assert not list(output.glob(".partial-*"))
    assert {path.name: path.stat().st_mtime_ns
            for path in (output / f"checkpoint-{reached:08d}").rglob("*")} == saved  # the checkpoint as it was

    finished(command(2, output))
    assert untimed(output) == untimed(runs / "ddp")
    expected = final_adapter(runs / "ddp")
    found = final_adapter(output)
    assert found.keys() == expected.keys()
    assert all(torch.equal(found[name], expected[name]) for name in expected)  # bit-identical


@pytest.mark.parametrize("fault, message", [
    ({"LEAF_TEST_GROUP_IDS": "local"}, "step 1: group id 0 was sampled by process 0 and by process 1"),
    ({"LEAF_TEST_EXTRA_FIELD": "1"}, "step 1: the processes' rollouts have different per-token fields: process 0's "
                                     "has surprisal, logprobs, process 1's surprisal, logprobs, confidence"),
])
def test_rollouts_that_cannot_form_one_step_are_refused_once(tmp_path, fault, message):
    done = launched(command(2, tmp_path / "run"), fault, timeout=300)
    assert done.returncode != 0
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    assert not traceback_through_leaf_plugins(done.stderr), done.stderr[-3000:]


def test_a_sharded_run_resumes_unsharded_and_on_other_process_counts(runs, tmp_path):
    """FSDP2 on 2 processes to step 6, one unsharded process to step 12, DDP on 3
    processes to the end: what one process trains, up to rounding."""
    output = tmp_path / "moved"
    finished(command(2, output, "sharding=fsdp2", "steps=6"))
    finished(command(1, output, "steps=12"))
    finished(command(3, output))
    assert_same_training(output, runs / "one")
    assert_same_adapter(output, runs / "one")
    assert [row["step"] for row in read_metrics(output / "metrics.jsonl")] == list(range(1, STEPS + 1))
