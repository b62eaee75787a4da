"""The lifecycle hooks (run start and end, each optimizer step, a plugin's state with
each checkpoint), through ``examples/leaf-weight-sync`` installed as a user installs it
and the real ``leaf`` command: an interrupted and resumed run records what an
uninterrupted one does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leaf_plugins.training.step_metrics import reproducible

pytestmark = pytest.mark.slow  # installs a package and runs leaf in fresh Pythons (seconds each)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = ROOT / "configs" / "runs" / "tiny-qwen2-audio.yaml"
STEPS, MINI_BATCHES, UPDATES = 3, 2, 2  # optimizer steps per training step: MINI_BATCHES x UPDATES

FAILING = '''
"""Not packaged: rewards from the response tokens alone (so that the groups' rewards
differ and the weights move), failing in score_rollouts at the step $LEAF_TEST_FAIL_AT
names (1-based), or in on_optimizer_step at the step $LEAF_TEST_FAIL_UPDATE_AT names."""

import os

from leaf_plugins import hookimpl
from leaf_plugins.training.step_metrics import reproducible


@hookimpl
def score_rollouts(context, rollout):
    if os.environ.get("LEAF_TEST_FAIL_AT") == str(context.step):
        raise RuntimeError("the scoring service is down")
    tokens = rollout.batch.tokens.clamp(min=0).cpu()  # [N, T]
    return (tokens.sum(dim=1) % 7).float() / 7  # [N]


@hookimpl
def on_optimizer_step(model, optimizer, step, update):
    if os.environ.get("LEAF_TEST_FAIL_UPDATE_AT") == str(step):
        raise RuntimeError("the engine refused the weights")
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("sources") / "leaf-weight-sync"
    shutil.copytree(EXAMPLES / "leaf-weight-sync", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                    "--disable-pip-version-check", "--target", str(target), str(source)], check=True)
    (target / "failing_plugin.py").write_text(FAILING)
    return target


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("task-cache")


def train(site: Path, cache: Path, out: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "LEAF_PLUGINS_STRICT"}
    environment["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), environment.get("PYTHONPATH", "")])
    environment.setdefault("OMP_NUM_THREADS", "1")
    environment.update(env)
    settings = [f"output_dir={out}", f"steps={STEPS}", "checkpoint_every=1", "rollout.prompts_per_step=2",
                "rollout.group_size=2", "rollout.max_new_tokens=4", "threads=1", "lora.rank=4", "lora.alpha=8",
                f"optim.mini_batches={MINI_BATCHES}", f"optim.updates_per_rollout={UPDATES}",
                "optim.learning_rate=0.01", f"task.options.cache_dir={cache}", "task.options.size=8",
                "task.options.validation_size=2", "task.options.test_size=2"]
    code = "import sys; from leaf_plugins.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "train", str(TINY), *settings, *overrides],
                          capture_output=True, text=True, env=environment, cwd=ROOT)


def metrics(out: Path) -> list[dict]:
    return [reproducible(json.loads(line))
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_every_optimizer_step_is_seen_and_the_count_survives_an_interrupted_run(site, cache, tmp_path):
    plugins = "plugins=[{name: weight-sync, params: {every: 1}}, failing_plugin]"
    whole = train(site, cache, tmp_path / "whole", plugins)
    assert whole.returncode == 0, whole.stderr
    record = json.loads((tmp_path / "whole" / "weight-sync.json").read_text())
    per_step = MINI_BATCHES * UPDATES
    assert record["optimizer_steps"] == STEPS * per_step
    assert [(push["step"], push["update"]) for push in record["pushes"]] == [
        (step, update) for step in range(1, STEPS + 1) for update in range(per_step)]
    assert len({push["checksum"] for push in record["pushes"]}) > 1  # the model handed over is the updated one

    cut = tmp_path / "cut"
    failed = train(site, cache, cut, plugins, LEAF_TEST_FAIL_AT=str(STEPS))  # steps 1..STEPS-1 are checkpointed
    assert failed.returncode == 2
    assert f"plugin 'failing_plugin' failed in its score_rollouts hook at step {STEPS}" in failed.stderr
    assert not (cut / "weight-sync.json").exists()  # on_run_end is not called after an error
    saved = torch.load(cut / f"checkpoint-{STEPS - 1:08d}" / "plugins" / "weight-sync.pt", weights_only=False)
    assert saved["optimizer_steps"] == (STEPS - 1) * per_step
    resumed = train(site, cache, cut, plugins)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {cut / f'checkpoint-{STEPS - 1:08d}'}" in resumed.stdout + resumed.stderr
    assert json.loads((cut / "weight-sync.json").read_text()) == record  # count, steps and checksums: bit-identical
    assert metrics(cut) == metrics(tmp_path / "whole")


def test_lifecycle_hooks_reach_only_named_plugins(site, cache, tmp_path):
    out = tmp_path / "unnamed"
    done = train(site, cache, out, "steps=1")  # weight-sync installed, not named
    assert done.returncode == 0, done.stderr
    assert not (out / "weight-sync.json").exists()
    assert not (out / "checkpoint-00000001" / "plugins").exists()


def test_a_failing_optimizer_step_hook_names_the_plugin_and_the_step(site, cache, tmp_path):
    done = train(site, cache, tmp_path / "run", "plugins=[failing_plugin]", LEAF_TEST_FAIL_UPDATE_AT="2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "leaf train: error: plugin 'failing_plugin' failed in its on_optimizer_step hook at step 2: "
        "RuntimeError: the engine refused the weights")
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1]  # the interrupted step was not logged
