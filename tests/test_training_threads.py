"""torch's thread count for a run: from the work of a step and the cores the process may
use (affinity, cgroup quota), unless the config, OMP_NUM_THREADS or the caller's own
torch.set_num_threads says otherwise; recorded with its reason in environment.json."""

from __future__ import annotations

import json

import pytest
import torch

from leaf_plugins.training.environment import ENVIRONMENT
from leaf_plugins.training.threads import (MIN_WORK_PER_THREAD, choose_threads, cgroup_cpu_quota, step_work,
                                           usable_cores)
from training_cases import config, examples, host

NO_VARIABLES: dict[str, str] = {}


def test_cgroup_v2_quota_in_cores_and_max_as_none(tmp_path):
    (tmp_path / "job").mkdir()
    membership = tmp_path / "cgroup"
    membership.write_text("0::/job\n")
    (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) == 1.5
    (tmp_path / "job" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) is None


def test_cgroup_v1_quota_from_the_cpu_hierarchy(tmp_path):
    (tmp_path / "cpu" / "job").mkdir(parents=True)
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/other\n1:cpu,cpuacct:/job\n0::/\n")
    (tmp_path / "cpu" / "job" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) == 3.0
    (tmp_path / "cpu" / "job" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path, membership) is None
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path / "missing-cgroup") is None  # no cgroup: no quota


def test_usable_cores_are_the_affinity_capped_by_the_quota_and_shared_among_local_processes():
    assert usable_cores(affinity=8, quota=None)[0] == 8
    assert usable_cores(affinity=8, quota=2.5)[0] == 2  # a quota of 2.5 cores runs 2 threads without throttling
    assert usable_cores(affinity=2, quota=4.0)[0] == 2  # the quota does not add CPUs
    assert usable_cores(affinity=2, quota=0.5)[0] == 1  # never below one
    cores, how = usable_cores(affinity=8, quota=None, local_processes=3)
    assert cores == 2 and "shared by 3 processes" in how


@pytest.mark.parametrize("hidden, rows, cores, expected", [
    (48, 48, 2, 1),  # tiny backbones: 2 * 48 * 48**2 = 221184 FLOPs, far below one thread's 2e7
    (4096, 48, 2, 2),  # 7B at the paper's K x prompts: 1.6e9 FLOPs, every core
    (4096, 48, 64, 64),
    (4096, 1, 16, 1),  # one row: 2 * 4096**2 = 3.36e7 FLOPs, one thread's share (floor 1.68)
    (2048, 8, 16, 3),  # 2 * 8 * 2048**2 = 6.71e7 FLOPs: floor(3.36) = 3
])
def test_threads_follow_the_work_of_a_projection_up_to_the_usable_cores(hidden, rows, cores, expected):
    assert step_work(hidden, rows) == 2 * rows * hidden * hidden
    choice = choose_threads(None, hidden, rows, cores, "given", environ=NO_VARIABLES, current=2, startup=2)
    assert choice.threads == expected
    assert f"hidden size {hidden}" in choice.reason and f"{cores} usable cores" in choice.reason
    assert MIN_WORK_PER_THREAD == 2e7  # the hand-worked cases above divide by it


def test_the_config_the_environment_and_the_callers_own_count_come_first():
    tiny = dict(hidden_size=48, rows=48, cores=2, cores_how="given")
    assert choose_threads(2, **tiny, environ=NO_VARIABLES, current=2, startup=2).threads == 2  # config wins
    assert choose_threads(3, **tiny, environ={"OMP_NUM_THREADS": "1"}, current=1, startup=1).threads == 3
    by_variable = choose_threads(None, **tiny, environ={"OMP_NUM_THREADS": "2"}, current=2, startup=2)
    assert by_variable.threads == 2 and "OMP_NUM_THREADS=2" in by_variable.reason
    assert choose_threads(None, **tiny, environ={"MKL_NUM_THREADS": "2"}, current=2, startup=2).threads == 2
    by_call = choose_threads(None, **tiny, environ=NO_VARIABLES, current=2, startup=4)
    assert by_call.threads == 2 and "torch.set_num_threads(2)" in by_call.reason
    # a count an earlier run of this process chose is not the caller's: the rule applies again
    assert choose_threads(None, **tiny, environ=NO_VARIABLES, current=1, startup=2, chosen=1).threads == 1
    unknown = choose_threads(None, None, 48, 2, "given", environ=NO_VARIABLES, current=2, startup=2)
    assert unknown.threads == 2 and "hidden size is unknown" in unknown.reason


def test_a_run_records_its_thread_count_and_why(tmp_path, monkeypatch):
    from leaf_plugins.training.trainer import Trainer

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    try:
        settings = config(tmp_path / "run", steps=1)
        settings.threads = 1
        trainer = Trainer(settings, examples(4), host=host())
        trainer.run()
        held = json.loads((tmp_path / "run" / ENVIRONMENT).read_text())
        assert held["threads"] == 1 == torch.get_num_threads()
        assert held["threads_reason"] == "threads: 1 in the run config"
        settings.threads = None  # the rule: the tiny backbone's projections are far below a thread's share
        settings.output_dir = str(tmp_path / "chosen")
        Trainer(settings, examples(4), host=host()).run()
        held = json.loads((tmp_path / "chosen" / ENVIRONMENT).read_text())
        assert held["threads"] == 1 and "hidden size 48, 32 rows" in held["threads_reason"]
    finally:
        torch.set_num_threads(before)
