"""Parameters of the objects a run config names other than its estimator: stage plugins
(``plugins: [{name:, params:}]``), the reward (``reward_params``), the rollout backend
(``rollout.backend_params``) and a task that declares them (``task.options``), validated
like an estimator's; swept in a study grid (``plugins.NAME.PARAM``); listed by
``leaf plugins``, which also lists the commands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from leaf_plugins import hookimpl, parameterised
from leaf_plugins.core.errors import ConfigError, PluginLoadError
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.task import Example
from leaf_plugins.rewards import SentenceBLEU
from leaf_plugins.studies.config import load_study
from leaf_plugins.training.config import load_train_config, task_examples
from leaf_plugins.training.stage_plugins import resolve_plugins

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = ROOT / "configs" / "runs" / "tiny-qwen2-audio.yaml"
MAX_NEW_TOKENS = 8

SCALED = '''
from dataclasses import dataclass, field

from leaf_plugins import hookimpl, parameterised


@dataclass(frozen=True)
class ScaledParams:
    factor: float = field(default=1.0, metadata={"help": "rewards are multiplied by this (> 0)"})
    label: str = "scaled"

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"factor must be > 0, got {self.factor!r}")


@parameterised(ScaledParams)
class Scaled:
    """Scores nothing itself (declines); keeps its parameters."""

    def __init__(self, params):
        self.params = params

    @hookimpl
    def score_rollouts(self, context, rollout):
        return None
'''


@dataclass(frozen=True)
class CountParams:
    size: int = field(default=3, metadata={"help": "examples in every split"})
    prompt: str = "Transcribe: <|audio|>"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


@parameterised(CountParams)
class CountTask:
    """A task of ``size`` silent examples, built with its parameters."""

    reward = "exact_match"

    def __init__(self, params: CountParams = CountParams()) -> None:
        self.params = params

    def load(self, split: str) -> list[Example]:
        import numpy as np

        return [Example(f"{split}-{i}", np.zeros(160, dtype=np.float32), self.params.prompt, "x", 0.01)
                for i in range(self.params.size)]


@dataclass(frozen=True)
class EchoParams:
    tag: str = "echo"


@parameterised(EchoParams)
class EchoBackend:
    """A backend with a parameter (never asked to sample here)."""

    def __init__(self, params: EchoParams = EchoParams()) -> None:
        self.params = params

    def sample(self, request):
        raise AssertionError("not sampled in these tests")


class Registrations:
    @hookimpl
    def register_tasks(self, register):
        register("count", CountTask())

    @hookimpl
    def register_rollout_backends(self, register):
        register("echo", EchoBackend())


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost.discover(extra_plugins=[("test-registrations", Registrations())])


@pytest.fixture
def scaled(tmp_path, monkeypatch) -> str:
    """An unpackaged class plugin, named by ``module:Class``."""
    (tmp_path / "scaled_plugin.py").write_text(SCALED)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "scaled_plugin:Scaled"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# ---------------------------------------------------------------- the generic door
def test_configured_builds_a_class_or_rebuilds_an_instance_with_its_validated_parameters():
    bleu = configured("reward", "sentence_bleu", SentenceBLEU(), {"lowercase": True})
    assert isinstance(bleu, SentenceBLEU) and bleu.params.lowercase is True
    assert bleu(["The cat sat"], ["the cat sat"]) == pytest.approx([1.0])
    assert SentenceBLEU()(["The cat sat"], ["the cat sat"])[0] < 1.0  # case-sensitive by default
    built = configured("task", "count", CountTask, {"size": 2})
    assert isinstance(built, CountTask) and built.params == CountParams(size=2)
    function = lambda predictions, references: [0.0] * len(predictions)  # noqa: E731
    assert configured("reward", "zero", function) is function
    with pytest.raises(ConfigError, match=r"reward 'zero' takes no parameters .* got 'scale'"):
        configured("reward", "zero", function, {"scale": 2})
    with pytest.raises(ConfigError) as error:
        configured("reward", "sentence_bleu", SentenceBLEU(), {"lowercas": True, "tokenize": "13b"})
    assert str(error.value) == ("reward 'sentence_bleu' has no parameter 'lowercas'. Did you mean 'lowercase'? Its "
                                "parameters: lowercase, tokenize; tokenize must be one of 13a, intl, char, zh, none; "
                                "got '13b'. Did you mean '13a'?")


@dataclass(frozen=True)
class BonusParams:
    bonus: float = field(default=0.1, metadata={"help": "added to every score"})


@parameterised(BonusParams)
def bonus_reward(predictions: list[str], references: list[str], params: BonusParams) -> list[float]:
    """Every prediction scores ``bonus``: a reward given as a function, with parameters."""
    return [params.bonus] * len(predictions)


class Counting:
    """A registered instance that keeps its own state when built with parameters."""

    parameters = BonusParams

    def __init__(self, calls: int = 0, params: BonusParams = BonusParams()) -> None:
        self.calls, self.params = calls, params

    def with_parameters(self, params: BonusParams) -> "Counting":
        return Counting(self.calls, params)


def test_a_function_and_an_instance_declare_parameters_through_the_same_protocol():
    scored = configured("reward", "bonus", bonus_reward, {"bonus": 0.5})
    assert scored(["a", "b"], ["x", "y"]) == [0.5, 0.5] and scored.__name__ == "bonus_reward"
    assert configured("reward", "bonus", bonus_reward)(["a"], ["x"]) == [0.1]  # the defaults
    kept = configured("reward", "counting", Counting(calls=7), {"bonus": 2})
    assert (kept.calls, kept.params.bonus) == (7, 2.0)  # its own state kept, not rebuilt from its class


class Registers:
    """Registers a reward that declares parameters it cannot be built with, and a good one."""

    @hookimpl
    def register_rewards(self, register):
        class Unbuildable:
            parameters = BonusParams

            def __call__(self, predictions, references):
                return [0.0] * len(predictions)

        register("unbuildable", Unbuildable())
        register("bonus", bonus_reward)


def test_a_plugin_that_declares_parameters_it_cannot_be_built_with_is_refused_when_it_registers():
    message = (r"reward 'unbuildable' from extra cannot be used: it declares `parameters = BonusParams` but no "
               r"`with_parameters\(params\)` to build it: decorate it with @parameterised\(BonusParams\)")
    with pytest.raises(PluginLoadError, match=message):
        PluginHost.discover(extra_plugins=[("registers", Registers())], strict=True)
    with pytest.warns(UserWarning, match=message):
        host = PluginHost.discover(extra_plugins=[("registers", Registers())], strict=False)
    assert "bonus" in host.rewards and "unbuildable" not in host.rewards  # its neighbour still registers


# ---------------------------------------------------------------- stage plugins
def test_a_class_plugin_is_built_with_its_parameters(scaled, host):
    plugin, = resolve_plugins([{"name": scaled, "params": {"factor": 2}}], host)
    assert plugin.params.factor == 2.0 and isinstance(plugin.params.factor, float)  # an int for a float: converted
    assert plugin.plugin.params == plugin.params  # the instance was built with them
    assert plugin.record()["params"] == {"factor": 2.0, "label": "scaled"}
    default, = resolve_plugins([scaled], host)  # a plain name: the defaults
    assert default.params.factor == 1.0


def test_plugin_parameter_mistakes_are_reported_where_they_were_given(scaled, host, tmp_path):
    run = write(tmp_path / "run.yaml", f"""
        steps: 1
        plugins:
          - name: "{scaled}"
            params:
              factr: 2
              label: 3
          - name: other
    """)
    with pytest.raises(ConfigError) as error:
        load_train_config(run, host=host)
    text = str(error.value)
    assert f"{run}:5:7: plugins[{scaled}].params.factr: plugin '{scaled}' has no parameter 'factr'. " \
           f"Did you mean 'factor'?" in text
    assert f"{run}:6:7: plugins[{scaled}].params.label: label must be a string, got 3" in text
    assert f"{run}:2:1: plugins: unknown plugin 'other'" in text
    with pytest.raises(ConfigError) as error:
        load_train_config(run, [f"plugins=[{{name: '{scaled}', params: {{factor: -1}}}}]"], host=host)
    assert (f"override \"plugins=[{{name: '{scaled}', params: {{factor: -1}}}}]\": plugins[{scaled}].params.factor: "
            f"factor must be > 0, got -1.0") in str(error.value)


def test_a_plugin_parameter_is_set_by_an_override_naming_it(scaled, host, tmp_path):
    run = write(tmp_path / "run.yaml", f"""
        plugins: ["{scaled}"]
    """)
    config = load_train_config(run, [f"plugins.{scaled}.factor=0.25"], host=host)
    assert [dict(entry) if isinstance(entry, dict) else entry for entry in config.plugins] == [
        {"name": scaled, "params": {"factor": 0.25}}]
    with pytest.raises(ConfigError) as error:
        load_train_config(run, ["plugins.scaled.factor=0.25"], host=host)
    assert (f"override 'plugins.scaled.factor=0.25': plugins.scaled.factor: plugin 'scaled' is not named in this "
            f"run's plugins ({scaled}): name it there to set its parameters.") in str(error.value)


def test_a_study_grid_sweeps_a_plugin_parameter(scaled, host, tmp_path):
    study = write(tmp_path / "study.yaml", f"""
        output_dir: {tmp_path / "out"}
        base:
          steps: 1
          plugins: ["{scaled}"]
        grid:
          plugins.{scaled}.factor: [0.5, 2]
    """)
    planned = load_study(study, host=host)
    assert [run.variation for run in planned.runs] == ["factor=0.5", "factor=2"]
    factors = [resolve_plugins(run.config.plugins, host)[0].params.factor for run in planned.runs]
    assert factors == [0.5, 2.0]
    bad = write(tmp_path / "bad.yaml", f"""
        output_dir: {tmp_path / "out"}
        base:
          plugins: ["{scaled}"]
        grid:
          plugins.{scaled}.factor: [0.5, -2]
    """)
    with pytest.raises(ConfigError) as error:
        load_study(bad, host=host)
    assert f"{bad}:5:{len(f'  plugins.{scaled}.factor: [0.5, ') + 1}: variation 'factor=-2': " \
           f"plugins[{scaled}].params.factor: factor must be > 0, got -2.0" in str(error.value)


# ---------------------------------------------------------------- reward, backend, task
def test_reward_and_backend_parameters_are_checked_against_their_dataclasses(host, tmp_path):
    run = write(tmp_path / "run.yaml", """
        reward: sentence_bleu
        reward_params: {lowercase: yes please}
        rollout:
          backend: echo
          backend_params:
            tga: x
    """)
    with pytest.raises(ConfigError) as error:
        load_train_config(run, host=host)
    text = str(error.value)
    assert f"{run}:2:17: reward_params.lowercase: lowercase must be true or false, got 'yes please'" in text
    assert (f"{run}:6:5: rollout.backend_params.tga: rollout backend 'echo' has no parameter 'tga'. Did you mean "
            f"'tag'? Its parameters: tag") in text
    config = load_train_config(run, ["reward_params.lowercase=true", "rollout.backend_params={tag: y}"], host=host)
    assert config.reward_params == {"lowercase": True} and config.rollout.backend_params == {"tag": "y"}
    unnamed = write(tmp_path / "unnamed.yaml", """
        rollout: {backend_params: {tag: x}}
        reward: exact_match
        reward_params: {scale: 2}
    """)
    with pytest.raises(ConfigError) as error:
        load_train_config(unnamed, host=host)
    assert (f"{unnamed}:1:11: rollout.backend_params: name the backend they are for in rollout.backend"
            in str(error.value))
    assert f"{unnamed}:3:17: reward_params.scale: reward 'exact_match' takes no parameters" in str(error.value)


def test_a_task_that_declares_parameters_is_built_with_its_options(host, tmp_path):
    run = write(tmp_path / "run.yaml", """
        task:
          name: count
          options: {size: 5}
    """)
    config = load_train_config(run, host=host)
    examples = task_examples(config.task, host=host)
    assert [example.id for example in examples] == [f"train-{i}" for i in range(5)]
    with pytest.raises(ConfigError) as error:
        load_train_config(run, ["task.options.size=0"], host=host)
    assert "override 'task.options.size=0': task.options.size: size must be >= 1, got 0" in str(error.value)
    with pytest.raises(ConfigError) as error:
        load_train_config(run, ["task.options.sise=2"], host=host)
    assert "task.options.sise: task 'count' has no parameter 'sise'. Did you mean 'size'?" in str(error.value)


class PlainTask:
    """A task that declares no parameters: one silent example per split."""

    reward = "exact_match"

    def load(self, split: str) -> list[Example]:
        import numpy as np

        return [Example(f"{split}-0", np.zeros(160, dtype=np.float32), "Transcribe: <|audio|>", "x", 0.01)]


class PlainRegistration:
    @hookimpl
    def register_tasks(self, register):
        register("plain", PlainTask())


def test_a_task_without_parameters_refuses_options_naming_it(tmp_path):
    host = PluginHost.discover(extra_plugins=[("plain-task", PlainRegistration())])
    run = write(tmp_path / "run.yaml", """
        task:
          name: plain
          options: {size: 5}
    """)
    with pytest.raises(ConfigError) as error:
        load_train_config(run, host=host)
    assert f"{run}:3:13: task.options.size: task 'plain' takes no parameters" in str(error.value)
    config = load_train_config(run, ["task.options={}"], host=host)
    assert [example.id for example in task_examples(config.task, host=host)] == ["train-0"]
    config.task.options = {"size": 5}
    with pytest.raises(ConfigError, match="task 'plain' takes no parameters .* got 'size'"):
        task_examples(config.task, host=host)


def test_every_shipped_run_config_stays_valid():
    for path in sorted((ROOT / "configs" / "runs").glob("*.yaml")):
        load_train_config(path)


# ---------------------------------------------------------------- through the CLI, installed as a user installs
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    sources = tmp_path_factory.mktemp("sources")
    for example in ("leaf-length-penalty", "leaf-checkpoints"):  # copied: pip builds in the tree
        shutil.copytree(EXAMPLES / example, sources / example, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                        "--disable-pip-version-check", "--target", str(target), str(sources / example)], check=True)
    return target


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("task-cache")


def leaf(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "LEAF_PLUGINS_STRICT"}
    environment["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), environment.get("PYTHONPATH", "")])
    environment.setdefault("OMP_NUM_THREADS", "1")
    code = "import sys; from leaf_plugins.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment,
                          cwd=ROOT)


def train(site: Path, cache: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    settings = [f"output_dir={out}", "steps=1", "checkpoint_every=1", "rollout.prompts_per_step=2",
                "rollout.group_size=4", f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "log_rollouts=true",
                "threads=1", "lora.rank=4", "lora.alpha=8", f"task.options.cache_dir={cache}", "task.options.size=8",
                "task.options.validation_size=2", "task.options.test_size=2"]
    return leaf(site, "train", str(TINY), *settings, *overrides)


def logged(out: Path) -> tuple[list[float], list[int]]:
    """Every logged response's reward and length."""
    groups = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return ([r for g in groups for r in g["rewards"]], [len(tokens) for g in groups for tokens in g["tokens"]])


@pytest.mark.slow
def test_the_length_penalty_parameter_reaches_the_hook(site, cache, tmp_path):
    plain = train(site, cache, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    named = train(site, cache, tmp_path / "named", "plugins=[{name: length-penalty, params: {penalty: 0.25}}]")
    assert named.returncode == 0, named.stderr
    task, lengths = logged(tmp_path / "plain")
    penalised, named_lengths = logged(tmp_path / "named")
    assert named_lengths == lengths and any(lengths)  # step 1 samples before any update: the same responses
    # the plugin subtracts in float32 (rewards in [0, 1]: rounding below 6e-8), the log holds float32 values
    assert penalised == pytest.approx([r - 0.25 * n / MAX_NEW_TOKENS for r, n in zip(task, lengths)], abs=1e-6)
    record = json.loads((tmp_path / "named" / "plugins.json").read_text())
    assert record[0]["plugins"][0]["params"] == {"penalty": 0.25}
    shown = leaf(site, "runs", "compare", str(tmp_path / "named"))
    assert shown.returncode == 0, shown.stderr
    rows = {cells[0]: cells[1:] for cells in map(str.split, shown.stdout.splitlines()) if cells}
    assert rows["metric"] == ["named"] and rows["step"] == ["1"]
    assert float(rows["reward_mean"][0]) == pytest.approx(sum(penalised) / len(penalised), rel=1e-5)  # 6 digits
    assert float(rows["response_tokens_mean"][0]) == pytest.approx(sum(lengths) / len(lengths), rel=1e-5)


@pytest.mark.slow
def test_a_misspelt_plugin_parameter_is_one_line_naming_the_override(site):
    override = "plugins=[{name: length-penalty, params: {penalti: 0.25}}]"
    done = leaf(site, "train", str(TINY), "--check", override)
    assert done.returncode == 2
    assert done.stderr.splitlines()[1:] == [
        f"  override {override!r}: plugins[length-penalty].params.penalti: plugin 'length-penalty' has no parameter "
        f"'penalti'. Did you mean 'penalty'? Its parameters: penalty"]
    checked = leaf(site, "train", str(EXAMPLES / "leaf-length-penalty" / "run.yaml"), "--check")
    assert checked.returncode == 0, checked.stderr


@pytest.mark.slow
def test_leaf_plugins_lists_stage_plugin_parameters_and_commands(site):
    done = leaf(site, "plugins", "--kind", "stage")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:3] == ["stage", "length-penalty",
                                                                          "leaf-length-penalty"])
    assert lines[row + 1].strip() == "parameters (plugins: [{name: length-penalty, params: {...}}]):"
    assert lines[row + 2].strip().split("  ")[0] == "penalty: float = 0.5"
    commands = leaf(site, "plugins", "--kind", "command")
    assert commands.returncode == 0, commands.stderr
    rows = [line.split()[:3] for line in commands.stdout.splitlines()]
    assert ["command", "checkpoints", "leaf-checkpoints"] in rows
    for name in ("train", "study", "plugins", "eval", "runs"):
        assert ["command", name, "leaf-plugins"] in rows
    assert all(row[0] in ("kind", "command") for row in rows if row)
    rewards = leaf(site, "plugins", "--kind", "reward")
    assert "lowercase: bool = false" in rewards.stdout and "lowercase: bool = true" in rewards.stdout


@pytest.mark.slow
def test_leaf_study_check_sweeps_the_length_penalty(site, tmp_path):
    study = write(tmp_path / "study.yaml", f"""
        output_dir: {tmp_path / "out"}
        base:
          steps: 1
          plugins: [length-penalty]
        grid:
          plugins.length-penalty.penalty: [0.25, 0.5]
    """)
    done = leaf(site, "study", str(study), "--check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == ["  penalty=0.25", "  penalty=0.5"]
    single = write(tmp_path / "single.yaml", f"""
        output_dir: {tmp_path / "out"}
        base:
          plugins: [length-penalty]
    """)
    bad = leaf(site, "study", str(single), "--check", "base.plugins.length-penalty.penalty=-1")
    assert bad.returncode == 2
    assert ("override 'base.plugins.length-penalty.penalty=-1': variation 'base': plugins[length-penalty].params."
            "penalty: penalty must be a finite number >= 0, got -1.0") in bad.stderr
