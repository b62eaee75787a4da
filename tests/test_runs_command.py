"""``leaf runs``: the list, compare and plot forms on real ``leaf train`` run directories (a
finished run, and one stopped by SIGINT after its first logged step, laid out as a study
lays out its runs), and on hand-made directories for a torn last line, a run killed
outright, and a run without ``status.json``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError, ConfigNotice
from leaf_plugins.commands import runs as runs_command
from leaf_plugins.training.run_directory import (METRICS_LOG, RUN_CONFIG, SHOWN_STATES, find_runs, read_metrics,
                                                 run_names, shown_state, summarise)
from leaf_plugins.training.run_status import RunStatus
from leaf_plugins.training.step_metrics import WALL_CLOCK_METRICS
from test_core_without_training_stack import run_without_training_stack
from written_files import run_naming_every_file_written

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "runs" / "tiny-qwen2-audio.yaml"
INTERRUPTED_STEPS = 200  # planned; SIGINT after the first logged step stops it long before


def train_command(output: Path, cache: Path, *overrides: str) -> list[str]:
    """``leaf train`` of the tiny backbone, a step in well under a second."""
    return [sys.executable, "-m", "leaf_plugins.cli", "train", str(TINY), f"output_dir={output}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "threads=1",
            f"task.options.cache_dir={cache}", "task.options.size=8", "task.options.validation_size=2",
            "task.options.test_size=2", *overrides]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A folder holding two real runs where a study puts them: ``runs/leaf/seed-0`` (2 of 2
    steps, finished) and ``runs/grpo/seed-0`` (interrupted by SIGINT after its first logged
    step). About 20 s."""
    folder = tmp_path_factory.mktemp("study")
    cache = tmp_path_factory.mktemp("task-cache")
    finished = subprocess.run(train_command(folder / "runs" / "leaf" / "seed-0", cache, "steps=2"),
                              env=environment(), capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    interrupted = folder / "runs" / "grpo" / "seed-0"
    process = subprocess.Popen(train_command(interrupted, cache, f"steps={INTERRUPTED_STEPS}", "estimator.name=grpo"),
                               env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # pytest ignores it
    log = interrupted / METRICS_LOG
    deadline = time.monotonic() + 300
    while not (log.exists() and log.read_text().endswith("\n")) and process.poll() is None:
        assert time.monotonic() < deadline, "no step logged in 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=300)
    assert process.returncode == 130, errors[-3000:]  # stopped by the signal, not finished
    return folder


def last_record(run: Path) -> dict:
    """The last line of the run's metrics.jsonl, read here without leaf_plugins."""
    return json.loads((run / METRICS_LOG).read_text().splitlines()[-1])


def table(printed: str) -> list[list[str]]:
    """The whitespace-separated cells of each printed line."""
    return [line.split() for line in printed.splitlines() if line.strip()]


def png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` from the PNG header (IHDR is the first chunk)."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", header[16:24])


# ------------------------------------------------------------------ real runs
def test_the_list_has_a_row_per_run_with_its_estimator_steps_reward_and_state(study, capsys):
    leaf_run, grpo_run = study / "runs" / "leaf" / "seed-0", study / "runs" / "grpo" / "seed-0"
    stopped_at = last_record(grpo_run)["step"]
    assert 1 <= stopped_at < INTERRUPTED_STEPS
    assert json.loads((grpo_run / "status.json").read_text())["state"] == "interrupted"
    assert main(["runs", str(study)]) == 0
    assert table(capsys.readouterr().out) == [
        ["run", "estimator", "steps", "reward_mean", "state"],
        ["runs/grpo/seed-0", "grpo", f"{stopped_at}/{INTERRUPTED_STEPS}", f"{last_record(grpo_run)['reward_mean']:.4f}",
         "interrupted"],
        ["runs/leaf/seed-0", "leaf", "2/2", f"{last_record(leaf_run)['reward_mean']:.4f}", "finished"],
    ]
    assert main(["runs", str(leaf_run)]) == 0  # a run directory itself: its path as given
    assert table(capsys.readouterr().out)[1][:3] == [str(leaf_run), "leaf", "2/2"]


def test_compare_shows_each_runs_last_logged_values(study, capsys):
    runs = [study / "runs" / "leaf" / "seed-0", study / "runs" / "grpo" / "seed-0"]
    last = [last_record(run) for run in runs]
    assert main(["runs", "compare", *map(str, runs)]) == 0
    rows = {cells[0]: cells[1:] for cells in table(capsys.readouterr().out) if len(cells) == 3}
    assert rows.pop("metric") == ["leaf/seed-0", "grpo/seed-0"]  # the directories both share left out
    assert rows.pop("step") == [str(record["step"]) for record in last]
    shared = (last[0].keys() & last[1].keys()) - {"step"} - set(WALL_CLOCK_METRICS)
    assert set(rows) == shared and "reward/sentence_bleu" in rows and "kl" in rows
    for metric, cells in rows.items():
        assert cells == [f"{record[metric]:.6g}" for record in last], metric


def test_compare_at_a_step_and_with_the_wall_clock_metrics(study, capsys):
    runs = [study / "runs" / "leaf" / "seed-0", study / "runs" / "grpo" / "seed-0"]
    first = [json.loads((run / METRICS_LOG).read_text().splitlines()[0]) for run in runs]
    assert main(["runs", "compare", *map(str, runs), "--step", "1", "--all"]) == 0
    rows = {cells[0]: cells[1:] for cells in table(capsys.readouterr().out) if len(cells) == 3}
    assert rows["step"] == ["1", "1"]
    assert rows["rollout_seconds"] == [f"{record['rollout_seconds']:.6g}" for record in first]
    assert rows["entropy"] == [f"{record['entropy']:.6g}" for record in first]
    assert main(["runs", "compare", *map(str, runs), "--step", "3"]) == 2
    assert f"{runs[0] / METRICS_LOG}: no step 3; it logged steps 1 to 2" in capsys.readouterr().err


def test_plot_writes_a_legible_png_of_the_metric_per_step(study, tmp_path, capsys, monkeypatch):
    runs = [str(study / "runs" / "leaf" / "seed-0"), str(study / "runs" / "grpo" / "seed-0")]
    out = tmp_path / "plots" / "curves.png"
    out.parent.mkdir()
    printed = run_naming_every_file_written(["runs", "plot", *runs, "--metric", "reward/sentence_bleu",
                                             "--metric", "entropy", "--out", str(out)], out.parent, capsys)
    assert printed.strip() == f"written: {out}"
    width, height = png_size(out)
    assert width == 800 and 300 <= height <= 1000 and out.stat().st_size > 10_000  # two panels with text
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (height, width)  # the whole image decodes
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "plot", *runs, "--metric", "reward/sentence_bleu"]) == 0
    assert capsys.readouterr().out.strip() == "written: runs-reward_sentence_bleu.png"
    assert png_size(tmp_path / "runs-reward_sentence_bleu.png")[0] == 800


def test_plot_names_an_unknown_metric_with_the_closest_and_every_metric(study, capsys):
    assert main(["runs", "plot", str(study / "runs" / "leaf" / "seed-0"), "--metric", "entropi"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("leaf runs: error: no run logged the metric 'entropi'. Did you mean 'entropy'? "
                            "Their metrics: advantage_abs_mean, ")
    assert error.count("\n") == 1 and "reward/sentence_bleu" in error


def test_every_form_reads_a_torn_last_line_of_a_real_run(study, tmp_path, capsys):
    torn = tmp_path / "torn"
    source = study / "runs" / "leaf" / "seed-0"
    torn.mkdir()
    for name in (RUN_CONFIG, METRICS_LOG, "status.json"):
        shutil.copy(source / name, torn / name)
    whole = last_record(source)
    with (torn / METRICS_LOG).open("a") as handle:
        handle.write(json.dumps({**whole, "step": 3})[:40])  # a write cut short by a kill
    assert main(["runs", str(tmp_path)]) == 0
    out, error = capsys.readouterr()
    assert table(out)[1][:3] == ["torn", "leaf", "2/2"]
    assert f"leaf runs: note: {torn / METRICS_LOG}:3: left out its unparsable last line" in error
    assert main(["runs", "compare", str(torn), str(source)]) == 0
    assert {cells[0]: cells[1:] for cells in table(capsys.readouterr().out)}["step"] == ["2", "2"]
    assert main(["runs", "plot", str(torn), "--metric", "kl", "--out", str(tmp_path / "kl.png")]) == 0
    assert png_size(tmp_path / "kl.png")[0] == 800


# ------------------------------------------------------------------ hand-made directories
def make_run(directory: Path, records: list[dict] | None, status: dict | None, steps: int = 5) -> Path:
    """A run directory with a config.yaml naming ``steps`` and the leaf estimator, the
    metrics ``records`` (None: no metrics.jsonl) and ``status`` (None: no status.json)."""
    directory.mkdir(parents=True)
    (directory / RUN_CONFIG).write_text(f"steps: {steps}\nestimator:\n  name: leaf\n  params: {{}}\n")
    if records is not None:
        (directory / METRICS_LOG).write_text("".join(json.dumps(record) + "\n" for record in records))
    if status is not None:
        (directory / "status.json").write_text(json.dumps(status))
    return directory


RECORDS = [{"step": 1, "reward_mean": 0.25, "kl": 0.0}, {"step": 2, "reward_mean": 0.5, "kl": 0.125}]


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    assert process.wait() == 0
    return process.pid


def test_a_run_without_status_is_unknown_with_the_steps_its_config_planned(tmp_path):
    run = make_run(tmp_path / "old", RECORDS, None, steps=7)
    row = summarise(run)
    assert (row.estimator, row.done, row.planned, row.reward_mean, row.state) == ("leaf", 2, 7, 0.5, "unknown")
    never = make_run(tmp_path / "never", None, {"state": "failed", "step": 0, "steps": 4, "message": "ValueError: x",
                                                "pid": 1, "host": "elsewhere", "time": "t"})
    row = summarise(never)
    assert (row.done, row.planned, row.reward_mean, row.state) == (0, 4, None, "failed")
    make_run(tmp_path / "config-only", None, None)  # neither log nor status: not a run
    (tmp_path / "old" / "checkpoint-00000002").mkdir()
    assert find_runs(tmp_path) == [tmp_path / "never", tmp_path / "old"]


def test_a_running_status_whose_process_is_gone_is_stopped():
    here = socket.gethostname()
    status = RunStatus("running", 1, 5, pid=dead_pid(), host=here)
    assert shown_state(status) == "stopped"
    assert shown_state(RunStatus("running", 1, 5, pid=os.getpid(), host=here)) == "running"
    assert shown_state(RunStatus("running", 1, 5, pid=dead_pid(), host=here + "-other")) == "running"  # unknowable
    assert shown_state(RunStatus("interrupted", 1, 5, pid=dead_pid(), host=here)) == "interrupted"
    assert shown_state(RunStatus("exploded", 1, 5)) == "unknown"
    assert shown_state(None) == "unknown"


def test_the_list_shows_a_killed_run_as_stopped(tmp_path, capsys):
    status = {"state": "running", "step": 0, "steps": 5, "message": "", "pid": dead_pid(),
              "host": socket.gethostname(), "time": "t"}
    make_run(tmp_path / "killed", RECORDS, status)
    assert main(["runs", str(tmp_path)]) == 0
    assert table(capsys.readouterr().out)[1] == ["killed", "leaf", "2/5", "0.5000", "stopped"]


def test_a_torn_last_line_is_left_out_and_a_bad_line_elsewhere_is_an_error(tmp_path):
    run = make_run(tmp_path / "run", RECORDS, None)
    with (run / METRICS_LOG).open("a") as handle:
        handle.write('{"step": 3, "reward_me\n')  # cut short, then a newline: still the last line
    with pytest.warns(ConfigNotice, match=r"metrics.jsonl:3: left out its unparsable last line"):
        assert read_metrics(run) == RECORDS
    (run / METRICS_LOG).write_text('{"step": 1}\n{"step": 2, "kl"\n{"step": 3}\n')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: not valid JSON"):
        read_metrics(run)
    (run / METRICS_LOG).write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: not a step's metrics"):
        read_metrics(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole log: no notice
        (run / METRICS_LOG).write_text('{"step": 1}\n\n{"step": 2}\n')
        assert [record["step"] for record in read_metrics(run)] == [1, 2]


def test_errors_name_the_culprit(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["runs", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (f"leaf runs: error: {tmp_path / 'empty'}: no training runs in it or below it "
                                       "(a run directory holds config.yaml and metrics.jsonl or status.json)\n")
    assert main(["runs", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such directory" in capsys.readouterr().err
    never = make_run(tmp_path / "never", None, {"state": "running", "step": 0, "steps": 4, "message": "",
                                                "pid": os.getpid(), "host": socket.gethostname(), "time": "t"})
    assert main(["runs", "compare", str(never)]) == 2
    assert f"leaf runs: error: {never}: no metrics.jsonl" in capsys.readouterr().err
    run = make_run(tmp_path / "run", RECORDS, None)
    assert main(["runs", "plot", str(run), "--metric", "kl", "--out", str(tmp_path / "kl.svg")]) == 2
    assert "the plot is a PNG" in capsys.readouterr().err


def test_a_folder_named_like_a_form_is_listed_with_the_list_form(tmp_path, capsys, monkeypatch):
    make_run(tmp_path / "compare" / "a", RECORDS, None)
    monkeypatch.chdir(tmp_path)
    for argv in (["runs", "list", "compare"], ["runs", "./compare"]):
        assert main(argv) == 0
        assert table(capsys.readouterr().out)[1][:3] == ["a", "leaf", "2/5"]


def test_run_names_drop_the_directories_every_run_shares():
    assert run_names([Path("/s/runs/leaf/seed-0"), Path("/s/runs/grpo/seed-0")]) == ["leaf/seed-0", "grpo/seed-0"]
    assert run_names([Path("a"), Path("a/b")]) == ["a", "a/b"]
    assert run_names([Path("/s/runs/leaf")]) == ["leaf"]


def test_the_help_and_the_docs_name_every_state():
    docs = (ROOT / "docs" / "runs.md").read_text()
    for state in SHOWN_STATES:
        assert state in runs_command.STATE_HELP and f"`{state}`" in docs, state


def test_the_file_names_are_those_the_trainer_writes():
    from leaf_plugins.training.run_config import RUN_CONFIG as WRITTEN

    assert RUN_CONFIG == WRITTEN


def test_listing_and_comparing_need_no_training_stack(tmp_path):
    """Without the ``train`` extra, list and compare work and plot (matplotlib) says which
    extra to install, in one line."""
    make_run(tmp_path / "run", RECORDS, None)
    out = run_without_training_stack(f"""
        import contextlib, io
        from leaf_plugins.cli import main
        for argv in (["runs", {str(tmp_path)!r}], ["runs", "compare", {str(tmp_path / 'run')!r}],
                     ["runs", "plot", {str(tmp_path / 'run')!r}, "--metric", "kl"]):
            printed, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(err):
                out[argv[1]] = [main(argv), printed.getvalue(), err.getvalue()]
    """, strict=False)
    assert out[str(tmp_path)][:2] == [0, "run  estimator  steps  reward_mean  state\n"
                                         "run  leaf       2/5    0.5000       unknown\n"]
    assert out["compare"][0] == 0
    assert table(out["compare"][1])[:4] == [["metric", "run"], ["step", "2"], ["reward_mean", "0.5"], ["kl", "0.125"]]
    status, _, error = out["plot"]
    assert status == 2 and error.count("\n") == 1 and "No module named 'matplotlib'" in error
    assert error.rstrip().endswith("pip install 'leaf-plugins[train]'")
