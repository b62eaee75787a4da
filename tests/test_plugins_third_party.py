"""A real third-party plugin package, and a broken one, installed and used through the
entry-point group, in subprocesses so the test environment itself stays clean."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test installs packages or runs leaf in a fresh Python (seconds each)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY_RUN = ROOT / "configs" / "runs" / "tiny-qwen2-audio.yaml"
SMALL_STEP = ["steps=1", "checkpoint_every=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
              "rollout.max_new_tokens=4"]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """The example packages installed into a private directory."""
    target = tmp_path_factory.mktemp("site")
    for package in ("leaf-rloo", "leaf-broken", "leaf-tempered"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
             "--disable-pip-version-check", "--target", str(target), str(EXAMPLES / package)],
            check=True,
        )
    return target


def run(plugin_path: Path, code: str, strict: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LEAF_PLUGINS_STRICT"}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_path), env.get("PYTHONPATH", "")])
    if strict:
        env["LEAF_PLUGINS_STRICT"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)


def leaf(plugin_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The ``leaf`` command line, in a process that sees the installed examples."""
    return run(plugin_path, f"from leaf_plugins.cli import main; raise SystemExit(main({list(argv)!r}))")


def test_plugins_lists_the_third_party_estimator_and_survives_the_broken_one(plugin_path):
    done = run(plugin_path, "from leaf_plugins.cli import main; raise SystemExit(main(['plugins']))")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:3] for line in done.stdout.splitlines()]
    assert ["estimator", "rloo", "leaf-rloo"] in rows
    for name in ("grpo", "leaf", "collision", "full_tree", "otb"):
        assert ["estimator", name, "leaf-plugins"] in rows
    assert "skipped plugin 'broken-estimator'" in done.stderr
    assert "this plugin is broken on purpose" in done.stderr


def test_third_party_estimator_runs_through_the_same_api(plugin_path):
    code = (
        "import leaf_plugins as lp\n"
        "b = lp.RolloutBatch.from_lists([[1, 2], [3], [4, 5, 6], [7]], [1.0, 0.0, 0.5, 0.9], [0, 0, 0, 1])\n"
        "print(lp.estimate(b, 'rloo').advantages.tolist())\n"
    )
    done = run(plugin_path, code)
    assert done.returncode == 0, done.stderr
    advantages = eval(done.stdout.strip())
    # r_i minus the mean of the other two rewards of group 0; group 1 has one response
    assert advantages[0][:2] == pytest.approx([1.0 - 0.25] * 2)
    assert advantages[1][0] == pytest.approx(0.0 - 0.75) and advantages[1][1:] == [0.0, 0.0]
    assert advantages[2] == pytest.approx([0.5 - 0.5] * 3)
    assert advantages[3] == [0.0, 0.0, 0.0]


def test_broken_plugin_is_fatal_in_strict_mode_and_named(plugin_path):
    done = run(plugin_path, "from leaf_plugins.cli import main; raise SystemExit(main(['plugins']))", strict=True)
    assert done.returncode != 0
    assert "plugin 'broken-estimator' failed to load" in done.stderr


def test_the_tempered_baseline_is_the_groups_soft_maximum(plugin_path):
    code = (
        "import leaf_plugins as lp\n"
        "b = lp.RolloutBatch.from_lists([[1, 2], [3], [4, 5, 6], [7], [8]], [1.0, 0.0, 0.5, 0.3, 0.3], [0, 0, 0, 1, 1])\n"
        "print([row[0] for row in lp.estimate(b, 'tempered', temperature=0.5).advantages.tolist()])\n"
        "engine = lp.Engine('tempered', params={'temperature': 4})\n"
        "print(type(engine.params).__name__, engine.params.temperature)\n"
        "print([row[0] for row in engine.estimate(b).advantages.tolist()])\n"
    )
    done = run(plugin_path, code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for temperature, line in ((0.5, lines[0]), (4.0, lines[2])):
        # b = tau * log(mean(exp(r / tau))) over group 0's rewards 1, 0, 0.5, worked out by hand
        b = temperature * math.log((math.exp(1 / temperature) + 1 + math.exp(0.5 / temperature)) / 3)
        want = [1 - b, 0 - b, 0.5 - b, 0.0, 0.0]  # group 1: equal rewards, baseline = their value
        assert eval(line) == pytest.approx(want, abs=1e-6)  # float32 advantages of values about 1
    assert lines[1] == "TemperedParams 4.0"  # the estimator's own dataclass; the int given became a float
    # the baseline lies between the group's mean (0.5) and its best reward (1), nearer the best when colder
    b_hot, b_cold = 1 - eval(lines[2])[0], 1 - eval(lines[0])[0]
    assert 0.5 < b_hot < b_cold < 1


def test_plugins_lists_the_estimators_own_parameter_with_its_package(plugin_path):
    done = leaf(plugin_path, "plugins", "--kind", "estimator")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:3] == ["estimator", "tempered", "leaf-tempered"])
    assert lines[row + 1].split() [:4] == ["temperature:", "float", "=", "1.0"]
    assert "tau > 0 of the soft-maximum baseline" in lines[row + 1]
    rloo = next(i for i, line in enumerate(lines) if line.split()[:3] == ["estimator", "rloo", "leaf-rloo"])
    assert lines[rloo + 1].strip() == "(no parameters)"


def test_train_sets_the_third_party_parameter_from_the_command_line(plugin_path, tmp_path):
    done = leaf(plugin_path, "train", str(TINY_RUN), "estimator.name=tempered", "estimator.params.temperature=0.5",
                f"output_dir={tmp_path / 'run'}", *SMALL_STEP)
    assert done.returncode == 0, done.stderr
    assert "switched the estimator to 'tempered', which does not read fork_budget" in done.stderr
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == [1]


@pytest.mark.parametrize("override, message", [
    ("estimator.params.temprature=0.5", "override 'estimator.params.temprature=0.5': estimator.params.temprature: "
                                        "estimator 'tempered' has no parameter 'temprature'. Did you mean "
                                        "'temperature'? Its parameters: temperature"),
    ("estimator.params.temperature=hot", "override 'estimator.params.temperature=hot': estimator.params.temperature: "
                                         "temperature must be a number, got 'hot'"),
    ("estimator.params.temperature=0", "override 'estimator.params.temperature=0': estimator.params.temperature: "
                                       "temperature must be a finite number > 0, got 0.0"),
])
def test_a_misspelt_or_ill_typed_parameter_is_one_line_naming_it(plugin_path, tmp_path, override, message):
    done = leaf(plugin_path, "train", str(TINY_RUN), "estimator.name=tempered", override,
                f"output_dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-2:] == [f"leaf train: error: {TINY_RUN}: 1 error in the configuration:",
                                             f"  {message}"]
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_a_study_grid_sweeps_the_third_party_parameter(plugin_path, tmp_path):
    done = leaf(plugin_path, "study", str(EXAMPLES / "leaf-tempered" / "study.yaml"), "--check",
                f"output_dir={tmp_path / 'study'}")
    assert done.returncode == 0, done.stderr
    assert "6 runs (3 variations x 2 seeds)" in done.stdout
    for value in ("0.1", "1.0", "10.0"):
        assert f"temperature={value}" in done.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {steps: 1, estimator: {name: tempered}}\ngrid:\n  estimator.params.temperature: [1.0, hot]\n")
    done = leaf(plugin_path, "study", str(bad), "--check", f"output_dir={tmp_path / 'bad'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (f"{bad}:3:39: variation 'temperature=hot': estimator.params.temperature: temperature must be a number, "
            f"got 'hot'") in done.stderr


def test_bench_speed_times_the_named_estimators_with_their_parameters(plugin_path, tmp_path):
    done = leaf(plugin_path, "bench", "speed", "--quick", "--repeats", "1", "--out", str(tmp_path),
                "--estimator", "grpo", "--estimator", "tempered:temperature=0.5")
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "speed.md").read_text()
    cells = {line.split("|")[2].strip() for line in table.splitlines() if line.startswith("| ")}
    assert cells - {"estimator"} == {"grpo", "tempered:temperature=0.5"}  # the named ones (no reference row)
    assert "| paper-6x8x200 | grpo |" in table and "×" in table  # grpo measured beside its slow reference


def test_bench_credit_measures_the_named_estimators_with_their_parameters(plugin_path, tmp_path):
    done = leaf(plugin_path, "bench", "credit", "--quick", "--regimes", "base", "--seeds", "1", "--learning-seeds", "1",
                "--out", str(tmp_path), "--estimator", "grpo", "--estimator", "tempered:temperature=0.5")
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:3] for line in (tmp_path / "credit.md").read_text().splitlines()[2:]]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["base", "grpo"], ["base", "tempered:temperature=0.5"], ["base", "oracle (true Q-V)"]]


@pytest.mark.parametrize("choice, message", [
    ("tempered:temprature=0.5", "--estimator 'tempered:temprature=0.5': estimator 'tempered' has no parameter "
                                "'temprature'. Did you mean 'temperature'? Its parameters: temperature"),
    ("tempered:temperature=hot", "--estimator 'tempered:temperature=hot': temperature must be a number, got 'hot'"),
    ("tempred", "--estimator 'tempred': Unknown estimator 'tempred'. Did you mean 'tempered'?"),
])
@pytest.mark.parametrize("which", ["speed", "credit"])
def test_bench_refuses_a_bad_estimator_choice_in_one_line(plugin_path, tmp_path, which, choice, message):
    done = leaf(plugin_path, "bench", which, "--quick", "--out", str(tmp_path), "--estimator", choice)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"leaf bench: error: {message}")
