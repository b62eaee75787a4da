"""The core install (no ``[train]`` extra): the estimators load and compute without the
training stack, and the commands that need it say which extra to install.

A subprocess hides the ``train`` extra's modules (an import of one raises
``ModuleNotFoundError``, as in an environment without them) and records every attempt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from leaf_plugins.core.plugins import BUILTIN_DISTRIBUTION, BUILTIN_KINDS, PluginHost, _builtin_kind

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STACK = ("transformers", "peft", "accelerate", "datasets", "sacrebleu", "soundfile", "matplotlib",
                  "pytest_benchmark")
PART_OF_THE_TRAINING_STACK = ("sacrebleu", "soundfile", "matplotlib", "pytest_benchmark")
"""What verl's environment lacks of the extra: it has transformers, peft, accelerate and datasets."""
HIDE_MODULES = """
import sys
ATTEMPTS = []
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in TRAIN:
            ATTEMPTS.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


def run_without_training_stack(code: str, strict: bool, hidden: tuple[str, ...] = TRAINING_STACK) -> dict:
    """Run ``code`` (which fills the dict ``out``) with the ``hidden`` modules of the training
    stack (default: all of them) hidden; its ``out``."""
    script = f"TRAIN = {set(hidden)!r}\n" + HIDE_MODULES + "out = {}\n" + textwrap.dedent(code) + (
        "\nout['attempts'] = ATTEMPTS\nimport json\nprint('OUT=' + json.dumps(out))\n")
    env = {**os.environ, "LEAF_PLUGINS_STRICT": "1" if strict else "0"}
    run = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("OUT="))
    return json.loads(line[len("OUT="):])


def test_estimators_compute_without_the_training_stack_and_import_no_model_code():
    out = run_without_training_stack("""
        import leaf_plugins as lp
        from leaf_plugins.integrations.padded import padded_batch
        batch = lp.RolloutBatch.from_lists(
            tokens=[[5, 7, 1, 2], [5, 7, 1, 3], [5, 8, 4], [6, 9]], rewards=[1.0, 0.0, 1.0, 0.0],
            group_ids=[0, 0, 0, 0], surprisal=[[.1, .2, 2., .3], [.1, .2, 2., .3], [.1, 3., .2], [.4, .1]])
        out['advantages'] = lp.estimate(batch, "leaf", fork_budget=1, normalize="none").advantages.tolist()
        for name in ("grpo", "collision", "full_tree", "tree_rloo"):
            lp.estimate(batch, name)
        out['modules'] = sorted(m for m in sys.modules if m.startswith("leaf_plugins."))
    """, strict=True)  # strict: a built-in estimator that failed to load would be fatal
    assert out["attempts"] == []  # not even tried
    assert [[round(x, 4) for x in row] for row in out["advantages"]] == [  # the README's example
        [0.1925, 0.8333, 0.8333, 0.8333], [0.1925, -1.1667, -1.1667, -1.1667],
        [0.1925, 0.8333, 0.8333, 0.0], [-1.0, -1.0, 0.0, 0.0]]
    loaded = {module.split(".")[1] for module in out["modules"]}
    assert loaded <= {"core", "estimators", "integrations"}, loaded


@pytest.mark.parametrize("hidden", [TRAINING_STACK, PART_OF_THE_TRAINING_STACK],
                         ids=["without the extra", "with part of it, as in verl's environment"])
def test_commands_that_need_the_training_stack_say_one_line_naming_the_extra(hidden):
    """No warning per built-in plugin that cannot load and no "Unknown reward": the one line
    docs/installation.md shows, and exit status 2 (warnings are errors in the subprocess)."""
    out = run_without_training_stack("""
        import contextlib, io
        from leaf_plugins.cli import main
        RUN, STUDY = "configs/runs/tiny-qwen2-audio.yaml", "configs/studies/demo.yaml"
        for argv in (["train", RUN], ["train", RUN, "--check"], ["train", RUN, "steps=1"], ["study", STUDY],
                     ["study", STUDY, "--check"], ["study", STUDY, "--table"],
                     ["warm-start", "configs/warm-start/tiny-qwen2-audio-translation.yaml"],
                     ["eval", "generate", RUN]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                out[" ".join(argv)] = [main(argv), err.getvalue()]
    """, strict=False, hidden=hidden)
    out.pop("attempts")
    assert len(out) == 8
    for command, (status, err) in out.items():
        name = command.split()[0]
        assert status == 2, (command, err)
        assert err.count("\n") == 1 and err.startswith(f"leaf {name}: error: No module named '"), (command, err)
        assert err.rstrip().endswith("this needs the training stack, which is not installed: "
                                     "pip install 'leaf-plugins[train]'"), (command, err)


def test_every_builtin_entry_point_has_a_kind():
    """The estimator host leaves out built-in entry points by their kind (``BUILTIN_KINDS``):
    a new built-in plugin module must be listed there, else it would be loaded everywhere."""
    builtins = [ep for ep in entry_points(group="leaf_plugins") if ep.dist is not None
                and ep.dist.name == BUILTIN_DISTRIBUTION]
    assert builtins
    unlisted = [ep.value for ep in builtins if _builtin_kind(ep) is None]
    assert unlisted == [], f"add these modules to BUILTIN_KINDS in leaf_plugins/core/plugins.py: {unlisted}"
    assert {_builtin_kind(ep) for ep in builtins} == set(BUILTIN_KINDS.values())


def test_the_estimator_host_has_the_full_hosts_estimators_and_loads_no_other_builtin():
    full = PluginHost.discover(strict=True)
    estimators = PluginHost.discover(strict=True, hooks={"register_estimators": "estimator"})
    assert list(estimators.registries) == ["estimator"]
    assert [(e.name, e.origin) for e in estimators.estimators] == [(e.name, e.origin) for e in full.estimators]
    builtin_kinds = {ep.name: _builtin_kind(ep) for ep in entry_points(group="leaf_plugins")
                     if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION}
    assert {builtin_kinds[name] for name in estimators.loaded if name in builtin_kinds} == {"estimator"}
