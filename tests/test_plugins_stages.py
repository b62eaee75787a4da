"""Stage plugins, rollout backends and commands from packages installed as a user installs
them (pip --target a private directory), driven through the real `leaf` console script
in subprocesses, so the test environment itself stays clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test installs packages or runs leaf in a fresh Python (seconds each)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = ROOT / "configs" / "runs" / "tiny-qwen2-audio.yaml"
PENALTY = 0.5  # examples/leaf-length-penalty: reward lost at rollout.max_new_tokens tokens
MAX_NEW_TOKENS = 8

BACKEND_PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "leaf-test-backend"
        version = "0.3.0"

        [project.entry-points.leaf_plugins]
        test-backends = "leaf_test_backend"

        [tool.setuptools]
        packages = ["leaf_test_backend"]
        """,
    "leaf_test_backend/__init__.py": '''
        """Rollout backends of a third party: one that records every request and samples
        through the built-in generate backend, one that supports no model."""

        import json
        import os

        from leaf_plugins import get_host, hookimpl


        class Recording:
            """generate, with every request written to $LEAF_TEST_REQUESTS."""

            def sample(self, request):
                with open(os.environ["LEAF_TEST_REQUESTS"], "a") as handle:
                    handle.write(json.dumps({
                        "step": request.context.step if request.context is not None else None,
                        "prompts": int(request.inputs["input_ids"].shape[0]), "group_size": request.group_size,
                        "max_new_tokens": request.max_new_tokens, "temperature": request.temperature,
                        "top_p": request.top_p, "group_ids": request.group_ids}) + "\\n")
                return get_host().rollout_backends.get("generate").sample(request)


        class Nothing:
            """Supports no model."""

            def unsupported_reason(self, model):
                return f"the nothing backend cannot sample from {type(model).__name__}"

            def sample(self, request):
                raise AssertionError("never asked to sample")


        @hookimpl
        def register_rollout_backends(register):
            register("recording", Recording())
            register("nothing", Nothing())
        ''',
}

FLAKY_SCORER = '''
"""A scoring plugin that is not packaged (named by module path): it fails at the step
$LEAF_TEST_FAIL_AT names (1-based) and otherwise leaves scoring to the built-in."""

import os

from leaf_plugins import hookimpl


@hookimpl
def score_rollouts(context, rollout):
    if os.environ.get("LEAF_TEST_FAIL_AT") == str(context.step):
        raise RuntimeError("the scoring service is down")
    return None
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example packages and the test backend installed into a private directory,
    with the unpackaged module beside them."""
    target = tmp_path_factory.mktemp("site")
    backend = tmp_path_factory.mktemp("leaf-test-backend")
    for relative, text in BACKEND_PACKAGE.items():
        (backend / relative).parent.mkdir(parents=True, exist_ok=True)
        (backend / relative).write_text(textwrap.dedent(text).lstrip())
    sources = tmp_path_factory.mktemp("sources")
    for example in ("leaf-length-penalty", "leaf-checkpoints", "leaf-broken-commands"):  # copied: pip builds in it
        shutil.copytree(EXAMPLES / example, sources / example, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    for package in (*sorted(sources.iterdir()), backend):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
             "--disable-pip-version-check", "--target", str(target), str(package)],
            check=True,
        )
    (target / "flaky_scorer.py").write_text(FLAKY_SCORER)
    return target


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("task-cache")


def leaf(site: Path, *args: str, strict: bool = False, path: Path | None = None,
         **env: str) -> subprocess.CompletedProcess[str]:
    """``leaf ARGS`` with the private site (and ``path``) importable and ``env`` set."""
    environment = {k: v for k, v in os.environ.items() if k != "LEAF_PLUGINS_STRICT"}
    extra = [str(path)] if path is not None else []
    environment["PYTHONPATH"] = os.pathsep.join([*extra, str(site), str(ROOT), environment.get("PYTHONPATH", "")])
    environment.update(env)
    if strict:
        environment["LEAF_PLUGINS_STRICT"] = "1"
    code = "import sys; from leaf_plugins.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment)


def train(site: Path, cache: Path, out: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    settings = [f"output_dir={out}", "steps=1", "checkpoint_every=1", "rollout.prompts_per_step=2",
                "rollout.group_size=4", f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "log_rollouts=true",
                "rollout.backend=generate", f"task.options.cache_dir={cache}", "task.options.size=8",
                "task.options.validation_size=2", "task.options.test_size=2"]
    return leaf(site, "train", str(TINY), *settings, *overrides, **env)


def logged(out: Path) -> tuple[list[list[float]], list[list[int]]]:
    """Rewards and response lengths of every response of the run's logged rollouts."""
    groups = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return [g["rewards"] for g in groups], [[len(tokens) for tokens in g["tokens"]] for g in groups]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_named_score_rollouts_plugin_changes_the_reward_and_an_unnamed_one_nothing(site, cache, tmp_path):
    plain = train(site, cache, tmp_path / "plain")  # installed, not named
    assert plain.returncode == 0, plain.stderr
    named = train(site, cache, tmp_path / "named", "plugins=[length-penalty]")
    assert named.returncode == 0, named.stderr
    task_rewards, lengths = logged(tmp_path / "plain")
    penalised, named_lengths = logged(tmp_path / "named")
    assert named_lengths == lengths  # step 1 samples before any update: the same responses
    assert any(length > 0 for group in lengths for length in group)
    for rewards, task, sizes in zip(penalised, task_rewards, lengths):
        # float32 rewards of size <= 1: a few ulps of float32
        assert rewards == pytest.approx([r - PENALTY * n / MAX_NEW_TOKENS for r, n in zip(task, sizes)], abs=1e-6)
    every = [r for group in penalised for r in group]
    assert metrics(tmp_path / "named")[0]["reward_mean"] == pytest.approx(sum(every) / len(every), abs=1e-6)
    record = json.loads((tmp_path / "named" / "plugins.json").read_text())
    assert record == [{"from_step": 0, "plugins": [{"name": "length-penalty", "distribution": "leaf-length-penalty",
                                                    "version": "0.1.0", "hooks": ["score_rollouts"],
                                                    "params": {"penalty": PENALTY}}]}]
    assert json.loads((tmp_path / "plain" / "plugins.json").read_text()) == [{"from_step": 0, "plugins": []}]


def test_the_length_penalty_example_config_names_the_plugin(site):
    """The command of docs/plugins.md and the example's README, once the example is installed."""
    done = leaf(site, "train", str(EXAMPLES / "leaf-length-penalty" / "run.yaml"), "--check")
    assert done.returncode == 0, done.stderr


def test_an_unknown_plugin_name_is_a_config_error_naming_it(site, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text() + "plugins:\n  - lenght-penalty\n")
    done = leaf(site, "train", str(config), "--check")
    assert done.returncode == 2
    line = next(line for line in done.stderr.splitlines() if "lenght-penalty" in line)
    assert f"{config}:" in line and "unknown plugin 'lenght-penalty'" in line
    assert "Did you mean 'length-penalty'?" in line
    assert "Traceback" not in done.stderr


def test_a_plugin_module_that_fails_to_import_is_a_config_error(site, tmp_path):
    (tmp_path / "broken_scorer.py").write_text("raise RuntimeError('missing credentials')\n")
    done = leaf(site, "train", str(TINY), "--check", "plugins=[broken_scorer]", path=tmp_path)
    assert done.returncode == 2
    assert "plugin module 'broken_scorer' failed to import: RuntimeError: missing credentials" in done.stderr
    assert "override 'plugins=[broken_scorer]'" in done.stderr


def test_a_plugin_raising_mid_run_is_named_with_its_hook_and_the_run_resumes(site, cache, tmp_path):
    out = tmp_path / "run"
    failed = train(site, cache, out, "steps=3", "plugins=[flaky_scorer]", LEAF_TEST_FAIL_AT="2")
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr
    assert ("leaf train: error: plugin 'flaky_scorer' failed in its score_rollouts hook at step 2: "
            "RuntimeError: the scoring service is down") in failed.stderr.splitlines()
    assert [m["step"] for m in metrics(out)] == [1]
    assert (out / "checkpoint-00000001").is_dir()
    resumed = train(site, cache, out, "steps=3", "plugins=[flaky_scorer]")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "(step 1 of 3; 2 to go)" in resumed.stdout
    assert [m["step"] for m in metrics(out)] == [1, 2, 3]
    record = json.loads((out / "plugins.json").read_text())
    assert record == [{"from_step": 0, "plugins": [{"name": "flaky_scorer", "distribution": None, "version": None,
                                                    "hooks": ["score_rollouts"]}]}]


def test_a_registered_rollout_backend_samples_for_the_trainer(site, cache, tmp_path):
    requests = tmp_path / "requests.jsonl"
    done = train(site, cache, tmp_path / "recording", "steps=2", "rollout.backend=recording",
                 LEAF_TEST_REQUESTS=str(requests))
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in requests.read_text().splitlines()]
    assert [call["step"] for call in calls] == [1, 2]  # 1-based, as every hook numbers the steps
    for call in calls:
        assert (call["prompts"], call["group_size"], call["max_new_tokens"]) == (2, 4, MAX_NEW_TOKENS)
        assert (call["temperature"], call["top_p"]) == (1.0, 0.9)  # the run config's (Table 7) defaults
    reference = train(site, cache, tmp_path / "generate", "steps=2")  # the built-in generate it delegates to
    assert reference.returncode == 0, reference.stderr
    assert metrics(tmp_path / "recording")[-1]["reward_mean"] == metrics(tmp_path / "generate")[-1]["reward_mean"]
    assert logged(tmp_path / "recording") == logged(tmp_path / "generate")


def test_an_unsupported_or_unknown_backend_is_refused_with_its_reason(site, cache, tmp_path):
    done = train(site, cache, tmp_path / "run", "rollout.backend=nothing")
    assert done.returncode == 2
    assert "rollout.backend=nothing: the nothing backend cannot sample from" in done.stderr
    assert "Traceback" not in done.stderr
    done = leaf(site, "train", str(TINY), "--check", "rollout.backend=recordin")
    assert done.returncode == 2
    assert "Unknown rollout backend 'recordin'. Did you mean 'recording'?" in done.stderr


def test_plugins_lists_third_party_backends_and_stage_plugins(site):
    done = leaf(site, "plugins")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:3] for line in done.stdout.splitlines()]
    assert ["rollout_backend", "recording", "leaf-test-backend"] in rows
    assert ["rollout_backend", "static", "leaf-plugins"] in rows
    assert ["stage", "length-penalty", "leaf-length-penalty"] in rows
    assert "hooks score_rollouts; enable it with plugins: [length-penalty] in a run config" in done.stdout


def test_a_command_plugin_adds_a_leaf_command(site, cache, tmp_path):
    out = tmp_path / "run"
    assert train(site, cache, out, "plugins=[length-penalty]").returncode == 0
    done = leaf(site, "checkpoints", str(out))
    assert done.returncode == 0, done.stderr
    header, row = [line.split() for line in done.stdout.splitlines()]
    assert header == ["run", "checkpoints", "newest", "plugins"]
    assert row == [str(out), "1", "checkpoint-00000001", "length-penalty==0.1.0"]
    missing = leaf(site, "checkpoints", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no config.yaml" in missing.stderr


def test_broken_command_plugins_leave_the_other_commands_working(site):
    done = leaf(site, "--help")
    assert done.returncode == 0, done.stderr
    for command in ("train", "study", "eval", "plugins", "runs"):
        assert f"    {command} " in done.stdout
    assert "\n    checkpoints" in done.stdout  # the example command plugin's
    assert "broken" not in done.stdout
    assert "skipped plugin 'broken-import'" in done.stderr  # fails to import
    assert ("skipped command 'broken' of leaf-broken-commands: add_arguments raised RuntimeError: this command is "
            "broken on purpose") in done.stderr
    assert leaf(site, "plugins", "--kind", "task").returncode == 0
    strict = leaf(site, "--help", strict=True)
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert strict.stderr.startswith("leaf: error: plugin 'broken-import' failed to load: ImportError")
