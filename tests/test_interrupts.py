"""Ctrl-C and SIGTERM at any instant end cleanly: ``leaf train`` / ``leaf study`` given
SIGINT or SIGTERM at instants drawn with a seeded generator (inside a step, right after
a checkpoint, while one is written, between the optimizer step and its log line, during
a study's evaluation, at wall-clock delays from start-up) exit with 130 / 143 after one
line on stderr, print no traceback, leave no half-written checkpoint, and a re-run ends
bit-identical to an uninterrupted run."""

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

from fault_injection import run_leaf
from leaf_plugins.core.interrupts import Interrupted, exit_status, interrupt_point, received, stop_on_signals
from leaf_plugins.training.checkpoint import latest_checkpoint
from test_fault_injection import STEPS, outcome, run_config, straight, study_file  # noqa: F401 (a fixture)

REPOSITORY = Path(__file__).resolve().parents[1]
SIGNALS = (signal.SIGINT, signal.SIGTERM)


# ------------------------------------------------------------------ the mechanism, in-process
def test_a_signal_is_recorded_where_it_lands_and_raised_at_the_next_safe_point():
    done = []
    with stop_on_signals():
        signal.raise_signal(signal.SIGTERM)
        done.append("the code after the signal ran")  # nothing is raised where the signal lands
        signal.raise_signal(signal.SIGINT)  # within the grace period: the same stop
        assert received() is not None and received().signal_number == signal.SIGTERM
        with pytest.raises(Interrupted) as caught:
            interrupt_point()
    assert done == ["the code after the signal ran"]
    assert caught.value.signal_number == signal.SIGTERM  # the first one that arrived
    assert exit_status(caught.value) == 143 and str(caught.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after the command
    assert received() is None
    interrupt_point()  # outside the block nothing is recorded


def test_an_inner_block_changes_nothing():
    with stop_on_signals():
        handler = signal.getsignal(signal.SIGINT)
        with stop_on_signals():
            assert signal.getsignal(signal.SIGINT) is handler
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(Interrupted):
            interrupt_point()


def test_a_signal_the_process_ignores_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals():
            signal.raise_signal(signal.SIGINT)  # nothing happens
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and received() is None
            interrupt_point()
    finally:
        signal.signal(signal.SIGINT, previous)


SECOND_SIGNAL = """
import os, signal, sys, time
from leaf_plugins.core.interrupts import GRACE_SECONDS, stop_on_signals
with stop_on_signals(label="leaf test"):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)  # relayed by a launcher: the same stop
    print("recorded", flush=True)
    time.sleep(GRACE_SECONDS + 0.5)
    read_end, _ = os.pipe()
    print("blocked", flush=True)
    os.read(read_end, 1)  # blocked in a system call, as a process in a collective: only the watcher sees signals
print("not reached", flush=True)
"""


def test_a_second_signal_after_the_grace_period_exits_at_once_even_from_a_blocked_call():
    process = subprocess.Popen([sys.executable, "-c", SECOND_SIGNAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert process.stdout.readline().strip() == "recorded"
    assert process.stdout.readline().strip() == "blocked"
    time.sleep(0.5)
    asked = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, errors = process.communicate(timeout=30)
    assert process.returncode == 130 and time.monotonic() - asked < 5, (process.returncode, errors)
    assert "not reached" not in out
    assert errors.strip() == "leaf test: second SIGINT: stopped at once (checkpoints are complete or absent; run the " \
                             "same command to resume)"


# ------------------------------------------------------------------ leaf train, signals at chosen instants
def signalled_config(tmp_path: Path) -> Path:
    """The kill tests' run, with a checkpoint at every step: a checkpoint is always near."""
    path = run_config(tmp_path, "signalled")
    path.write_text(path.read_text().replace("checkpoint_every: 2", "checkpoint_every: 1"))
    return path


def draw_instants(seed: int, count: int, saved: int) -> tuple[str, int, int]:
    """One (point, n, signal) reachable from a run whose newest checkpoint is ``saved``."""
    rng = random.Random(seed * 1000 + count)
    left = STEPS - saved
    choices = [("sampling", 3 * left), ("scoring", left), ("estimate", left), ("backward", left),
               ("optimizer.step", left), ("metrics.write", left), ("rollouts.write", left),
               ("checkpoint.adapter", left), ("checkpoint.rename", left), ("checkpoint.saved", left)]
    if saved > 0:
        choices.append(("log.rewrite", 1))  # the resume cuts metrics.jsonl back first
    point, most = rng.choice([choice for choice in choices if choice[1] > 0])
    return point, rng.randint(1, most), rng.choice(SIGNALS)


# Ctrl-C right after a checkpoint, then in the step after one (a checkpoint resumed: the
# step it holds is not saved again), a checkpoint write interrupted, then instants drawn
# with a seeded generator until the run is done.
FIXED = [("checkpoint.saved", 1, signal.SIGINT), ("estimate", 1, signal.SIGINT), ("checkpoint.rename", 1, signal.SIGTERM)]
DRAWN = 5
SEED = 38


def _stderr_is_one_clean_line(text: str, name: str) -> None:
    assert "Traceback" not in text, text
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("leaf ")]
    assert len(lines) == 1 and lines[0].startswith(f"leaf train: interrupted ({name}); kept "), text


@pytest.mark.slow
def test_sigint_and_sigterm_at_seeded_instants_end_cleanly_and_resume_bit_identical(straight, tmp_path):
    _, (adapter, metrics, rollouts) = straight
    config = signalled_config(tmp_path)
    directory = tmp_path / "signalled"
    done = 0
    while done < len(FIXED) + DRAWN:
        found = latest_checkpoint(directory) if directory.exists() else None
        saved = int(found.name.split("-")[1]) if found else 0
        if saved == STEPS:
            break
        point, n, number = FIXED[done] if done < len(FIXED) else draw_instants(SEED, done, saved)
        errors = tmp_path / f"stderr-{done}.txt"
        code = run_leaf(["train", str(config)], point, n, signal_number=number, stderr=str(errors))
        if code == 0:  # the signal came while the last step was saved: no safe point was left, the run is complete
            assert latest_checkpoint(directory).name == f"checkpoint-{STEPS:08d}", (point, n)
            done += 1
            break
        assert code == 128 + number, f"{point} #{n} ({signal.Signals(number).name}): exit {code}"
        _stderr_is_one_clean_line(errors.read_text(), signal.Signals(number).name)
        assert not list(directory.glob(".partial-*")) and not list(directory.glob(".*.tmp")), point
        assert len(list(directory.glob("checkpoint-*"))) <= 1
        done += 1
    assert done > len(FIXED)  # drawn instants were tried before the run was done
    assert run_leaf(["train", str(config)]) == 0
    got_adapter, got_metrics, got_rollouts = outcome(directory)
    assert got_adapter.keys() == adapter.keys()
    for name in adapter:
        assert torch.equal(got_adapter[name], adapter[name]), name  # bit-identical
    assert got_metrics == metrics and got_rollouts == rollouts


@pytest.mark.slow
def test_signals_at_seeded_wall_clock_delays_from_start_up(straight, tmp_path):
    """The real ``leaf`` process (a fresh interpreter), signalled after a delay drawn from
    [0.3 s, 8 s): start-up, the model's loading, steps, checkpoints, wherever it falls."""
    _, (adapter, metrics, _) = straight
    config = run_config(tmp_path, "timed")
    directory = tmp_path / "timed"
    rng = random.Random(SEED)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPOSITORY), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "leaf_plugins.cli", "train", str(config)]
    for _ in range(4):
        number, delay = rng.choice(SIGNALS), rng.uniform(0.3, 8.0)
        process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, restore_signals=True,  # SIGINT as in a terminal, even when
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # pytest ignores it
        time.sleep(delay)
        process.send_signal(number)
        _, errors = process.communicate(timeout=600)
        name = signal.Signals(number).name
        if process.returncode == 0:  # finished before the signal: the run is complete
            break
        assert process.returncode == 128 + number, errors
        assert "Traceback" not in errors, errors
        lines = [line for line in errors.replace("\r", "\n").splitlines() if line.startswith("leaf")]
        assert len(lines) == 1 and f"interrupted ({name})" in lines[0], errors
        assert not list(directory.glob(".partial-*"))
    assert subprocess.run(command, env=environment, capture_output=True).returncode == 0
    got_adapter, got_metrics, _ = outcome(directory)
    assert all(torch.equal(got_adapter[name], adapter[name]) for name in adapter)  # bit-identical
    assert got_metrics == metrics


# ------------------------------------------------------------------ leaf study
@pytest.mark.slow
def test_a_study_signalled_in_training_and_in_evaluation_resumes_to_the_same_table(tmp_path):
    assert run_leaf(["study", str(study_file(tmp_path, "straight"))]) == 0
    signalled = study_file(tmp_path, "signalled")
    for point, n, number in [("backward", 3, signal.SIGINT), ("evaluate", 1, signal.SIGTERM)]:
        errors = tmp_path / f"{point}.txt"
        assert run_leaf(["study", str(signalled)], point, n, signal_number=number, stderr=str(errors)) == 128 + number
        text = errors.read_text()
        assert "Traceback" not in text
        assert f"leaf study: interrupted ({signal.Signals(number).name}); kept the finished runs in " in text
        assert not list((tmp_path / "signalled").rglob(".partial-*"))
    assert run_leaf(["study", str(signalled)]) == 0
    for table in ("results.csv", "results.md"):
        got = (tmp_path / "signalled" / table).read_text().replace("signalled.yaml", "straight.yaml")
        assert got == (tmp_path / "straight" / table).read_text()


def test_an_interrupt_received_before_a_plugin_fails_to_load_stops_plugin_loading():
    from leaf_plugins.core.plugins import PluginHost

    def import_that_wraps_ctrl_c() -> None:  # a subprocess the signal ended, reported as an import error
        signal.raise_signal(signal.SIGINT)
        raise ImportError("Could not import module 'SomeModel'")

    host = PluginHost.__new__(PluginHost)
    host.failures = []
    with stop_on_signals():
        with pytest.raises(Interrupted):
            host._guard("some-plugin", False, import_that_wraps_ctrl_c)
    assert host.failures == []  # not reported as a broken plugin
