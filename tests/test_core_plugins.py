"""The plugin host, registries, parameters, the engine and the hookspec reference."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import leaf_plugins
from leaf_plugins import ConfigError, RolloutBatch, UnknownNameError, estimate, hookimpl
from leaf_plugins.cli import main
from leaf_plugins.core.errors import DuplicateNameError
from leaf_plugins.core.hookspecs import LeafSpecs
from leaf_plugins.commands.plugins import description
from leaf_plugins.core.plugins import BUILTIN_DISTRIBUTION, KINDS, PluginHost, discover_commands, get_host
from leaf_plugins.core.registry import Registry

BUILTIN_ESTIMATORS = {"grpo", "leaf", "collision", "full_tree", "otb"}


def test_builtins_register_through_entry_points():
    host = PluginHost.discover(strict=True)
    assert BUILTIN_ESTIMATORS <= set(host.estimators.names())
    for name in BUILTIN_ESTIMATORS:
        assert host.estimators.entry(name).origin == "leaf-plugins"


def test_unknown_name_gives_did_you_mean_and_the_known_names():
    registry: Registry[int] = Registry("estimator")
    for name in ("leaf", "grpo", "full_tree"):
        registry.add(name, 0, "pkg")
    with pytest.raises(UnknownNameError) as error:
        registry.get("lefa")
    assert "Did you mean 'leaf'?" in str(error.value)
    assert "Available: full_tree, grpo, leaf" in str(error.value)


def test_duplicate_names_name_both_origins():
    class Again:
        @hookimpl
        def register_estimators(self, register):
            register("leaf", object())

    with pytest.raises(DuplicateNameError, match=r"'leaf' is registered twice: by leaf-plugins and by extra"):
        PluginHost.discover(extra_plugins=[("again", Again())], strict=True)
    with pytest.warns(UserWarning, match="skipped plugin 'again'"):
        host = PluginHost.discover(extra_plugins=[("again", Again())], strict=False)
    assert "leaf" in host.estimators


def test_a_plugin_that_raises_while_registering_is_skipped_with_its_name():
    class Broken:
        @hookimpl
        def register_tasks(self, register):
            raise RuntimeError("cannot find my data")

    with pytest.warns(UserWarning, match="skipped plugin 'broken-tasks': RuntimeError: cannot find my data"):
        host = PluginHost.discover(extra_plugins=[("broken-tasks", Broken())], strict=False)
    assert BUILTIN_ESTIMATORS <= set(host.estimators.names())


def test_misspelt_hook_fails_at_registration():
    class Misspelt:
        @hookimpl
        def register_estimator(self, register):  # missing "s"
            register("x", object())

    with pytest.raises(Exception, match="register_estimator"):
        PluginHost.discover(extra_plugins=[("misspelt", Misspelt())], strict=True)


def test_parameters_are_validated_per_estimator():
    batch = RolloutBatch.from_lists([[1, 2]], [1.0], [0], surprisal=[[1.0, 1.0]])
    with pytest.raises(ConfigError, match="estimator 'grpo' has no parameter 'fork_budget'"):
        estimate(batch, "grpo", fork_budget=2)
    with pytest.raises(ConfigError, match=r"normalize must be one of none, span, token, batch; got 'spam'\. Did you mean 'span'"):
        estimate(batch, "leaf", normalize="spam")
    with pytest.raises(ConfigError, match="min_group must be an integer >= 2"):
        estimate(batch, "leaf", min_group=1)
    with pytest.raises(ConfigError, match="unknown estimator stage 'select_boundary'"):
        estimate(batch, "leaf", stages={"select_boundary": "collision"})


def test_leaf_without_surprisal_explains_what_is_missing():
    batch = RolloutBatch.from_lists([[1, 2, 3]], [1.0], [0])
    with pytest.raises(ConfigError, match="surprisal"):
        estimate(batch, "leaf")


def test_observers_see_every_estimate():
    seen = []

    class Recorder:
        @hookimpl
        def on_estimate(self, batch, result):
            seen.append((batch.size, result.estimator))

    batch = RolloutBatch.from_lists([[1, 2], [1, 3]], [1.0, 0.0], [0, 0], surprisal=[[1, 1], [1, 1]])
    engine = leaf_plugins.Engine("leaf", observers=[Recorder()])
    engine.estimate(batch)
    engine.estimate(batch)
    assert seen == [(2, "leaf"), (2, "leaf")]


def test_every_hook_is_documented_and_firstresult_hooks_say_so():
    hooks = [(name, fn) for name, fn in inspect.getmembers(LeafSpecs, inspect.isfunction)]
    assert {"register_estimators", "select_boundaries", "retain_nodes", "compute_advantages"} <= {n for n, _ in hooks}
    for name, fn in hooks:
        doc = inspect.getdoc(fn) or ""
        assert len(doc) > 40, f"hook {name} needs a docstring (the hookspecs are the plugin reference)"
        first_result = getattr(fn, "leaf_plugins_spec")["firstresult"]
        assert ("Stops at first non-None result." in doc) == first_result, name


def test_the_writing_plugins_guide_names_every_hook():
    guide = (Path(leaf_plugins.__file__).parents[1] / "docs" / "plugins.md").read_text()
    for name, _ in inspect.getmembers(LeafSpecs, inspect.isfunction):
        assert f"`{name}`" in guide, f"docs/plugins.md does not name the hook {name}"


def test_builtin_rollout_backends_and_commands_register_through_entry_points():
    host = PluginHost.discover(strict=True)
    assert host.rollout_backends.names() == ["generate", "static"]
    assert {entry.origin for entry in host.rollout_backends} == {"leaf-plugins"}
    commands = discover_commands(strict=True).registries["command"]
    assert {"train", "study", "eval", "plugins", "bench", "tasks"} <= set(commands.names())
    assert {entry.origin for entry in commands} == {"leaf-plugins"}


def test_cli_lists_plugins(capsys):
    assert main(["plugins", "--kind", "estimator"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN_ESTIMATORS:
        assert any(line.split()[:3] == ["estimator", name, "leaf-plugins"] for line in out.splitlines())


def test_cli_shows_every_builtin_description_whole(capsys):
    """``leaf plugins`` shows the first paragraph of a built-in's docstring (a command: its
    help), never a cut one: every shown description ends a sentence."""
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = [(kind, entry.name, description(entry.value)) for kind in KINDS for entry in get_host().registries[kind]
             if entry.origin == BUILTIN_DISTRIBUTION]
    shown += [("command", entry.name, entry.value.help) for entry in discover_commands().registries["command"]
              if entry.origin == BUILTIN_DISTRIBUTION]
    assert {kind for kind, _, _ in shown} == {*KINDS, "command"}
    for kind, name, text in shown:
        assert text.endswith((".", "!", "?")), f"{kind} {name}: the description {text!r} does not end a sentence"
        assert any(line.split()[:3] == [kind, name, BUILTIN_DISTRIBUTION] and line.endswith(f"  {text}")
                   for line in lines), f"{kind} {name}: leaf plugins does not show {text!r} whole"


def test_core_never_imports_the_trainer():
    """The stage hooks' types live in core (``core/stages.py``): no module of core, not
    even under ``TYPE_CHECKING``, imports ``leaf_plugins.training`` (no import circle)."""
    import ast
    from pathlib import Path

    core = Path(leaf_plugins.__file__).parent / "core"
    found = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.name}: {name}" for name in names if name.startswith("leaf_plugins.training")]
    assert not found
    from leaf_plugins.core.stages import PolicyLoss, Rollout, StepContext

    hints = {name: inspect.signature(getattr(LeafSpecs, name)).parameters for name in ("rollout", "compute_loss")}
    assert "context" in hints["rollout"] and "StepContext" in str(hints["compute_loss"]["context"].annotation)
    assert {Rollout.__module__, StepContext.__module__, PolicyLoss.__module__} == {"leaf_plugins.core.stages"}
