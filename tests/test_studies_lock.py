"""One study per output directory (a lock that a kill never leaves stale), and a
warm-start directory is never reused for other warm-start settings."""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import asdict
from pathlib import Path

import pytest

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.studies.claims import claim
from leaf_plugins.studies.config import load_study
from leaf_plugins.studies.lock import LOCK, StudyLock
from leaf_plugins.studies.runner import WARM_START_RECORD, run_study


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_is_released_on_exit(tmp_path):
    with StudyLock(tmp_path / "out"):
        with pytest.raises(ConfigError, match=rf"{tmp_path / 'out'} is in use by another `leaf study` "
                                              rf"\(pid {os.getpid()}, since .*\): wait for it"):
            with StudyLock(tmp_path / "out"):
                pass
    with StudyLock(tmp_path / "out"):  # free again
        pass


def _hold_and_die(directory: str, ready) -> None:
    lock = StudyLock(Path(directory)).__enter__()
    ready.set()
    assert lock.handle is not None
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_study_killed_with_the_lock_held_leaves_no_stale_lock(tmp_path):
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    process = context.Process(target=_hold_and_die, args=(str(tmp_path), ready))
    process.start()
    process.join(120)
    assert ready.is_set() and process.exitcode == -signal.SIGKILL
    assert f"pid {process.pid}" in (tmp_path / LOCK).read_text()  # the file stays; the kernel dropped the lock
    with StudyLock(tmp_path):
        pass


def study_file(tmp_path: Path, epochs: int) -> Path:
    path = tmp_path / f"study-{epochs}.yaml"
    path.write_text(f"""\
output_dir: {tmp_path / 'out'}
warm_start: {{output_dir: {tmp_path / 'ws'}, epochs: {epochs}, backbone: {{name: tiny-qwen2-audio}}}}
base: {{steps: 1}}
""")
    return path


def test_a_second_study_on_a_busy_output_directory_is_refused_before_writing_anything(tmp_path):
    study = load_study(study_file(tmp_path, 2))
    with StudyLock(study.output_dir):
        before = sorted(p.name for p in study.output_dir.iterdir())
        with pytest.raises(ConfigError, match="is in use by another `leaf study`"):
            run_study(study)
        assert sorted(p.name for p in study.output_dir.iterdir()) == before == [LOCK]
    assert not (tmp_path / "ws").exists()


def test_a_warm_start_directory_made_with_other_settings_is_an_error_not_a_reuse(tmp_path):
    first = load_study(study_file(tmp_path, 1))
    claim(tmp_path / "ws", WARM_START_RECORD, asdict(first.warm_start), "a warm start")
    (tmp_path / "ws" / "model").mkdir()
    (tmp_path / "ws" / "model" / "config.json").write_text("{}")  # a finished warm start
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'ws'} holds a warm start with other settings "
                                          rf"\(epochs: 1 -> 2\): delete it or give the study another output_dir"):
        run_study(load_study(study_file(tmp_path, 2)))


def test_a_warm_start_directory_without_its_record_is_an_error(tmp_path):
    (tmp_path / "ws" / "model").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds files of a warm start with unknown settings \(no warm_start.json\)"):
        run_study(load_study(study_file(tmp_path, 2)))
