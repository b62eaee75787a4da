"""The README's and the docs' examples, extracted from the Markdown itself (so an edit of
the text is what gets tested) and run on a fresh copy of the tracked tree, as a new user
would:

- the README's ``leaf train`` block, each command as written with ``steps=1`` appended
  (the block's first command trains 20 steps, minutes on 2 CPU cores: too long for CI; an
  appended override wins over the file and over the earlier overrides, so everything else
  is as written);
- the README's Python examples: advantages of a batch against the values worked by hand
  from the LEAF rules, and a third-party estimator with its own parameter dataclass;
- the plugin example (``pip install ./examples/leaf-rloo && leaf plugins --kind
  estimator``) and the example's own README, installed into a throwaway environment
  that sees this one's packages, so this environment is never changed;
- the TRL snippet of docs/integrations.md ("Try it on the CPU");
- every ``leaf train`` and ``leaf study`` command of the README's and docs' bash blocks
  (also under ``accelerate launch`` or ``torchrun ... -m leaf_plugins.cli``), validated with ``--check``
  (their runs are minutes to hours long);
- every other ``leaf`` command of those blocks parses with the CLI's own parser (an
  unknown command or option fails);
- every relative link of the README points at a file of the repository (the docs' own
  links are checked by ``mkdocs build --strict``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from leaf_plugins.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # the plugin's README: in the plugin test


def fenced(markdown: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of ``markdown``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, re.M | re.S)


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: comments dropped, ``a && b``
    split into two (every block of the docs is a list of plain commands)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        command: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word != "&&":
                command.append(word)
            elif command:
                out.append(command)
                command = []
    return out


def as_leaf_command(argv: list[str]) -> list[str]:
    """``argv`` as the ``leaf`` command it runs: itself, or the part of an ``accelerate
    launch ... -m leaf_plugins.cli ARGS`` or ``torchrun ... -m leaf_plugins.cli ARGS``
    after the module, as ``leaf ARGS``."""
    launcher = argv[:2] == ["accelerate", "launch"] or argv[:1] == ["torchrun"]
    if launcher and "leaf_plugins.cli" in argv:
        return ["leaf", *argv[argv.index("leaf_plugins.cli") + 1:]]
    return argv


def leaf_train_and_study_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every ``leaf train|study`` command in a bash block of the docs,
    except those that read a run directory an earlier command of the block writes (they
    run in order: ``test_the_run_directory_block_runs_in_order``)."""
    found = []
    for document in DOCUMENTS:
        for number, block in enumerate(fenced(document.read_text(), "bash")):
            written: list[str] = []
            for argv in map(as_leaf_command, commands(block)):
                if argv[:2] not in (["leaf", "train"], ["leaf", "study"]):
                    continue
                if any(argv[2] == run or argv[2].startswith(run + "/") for run in written):
                    continue
                found.append((f"{document.relative_to(REPO)}#{number}", argv))
                written += [word.split("=", 1)[1] for word in argv if word.startswith("output_dir=")]
    return found


def python_block(markdown: str, containing: str) -> str:
    """The one ```python block of ``markdown`` that contains ``containing``."""
    (block,) = [block for block in fenced(markdown, "python") if containing in block]
    return block


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the tracked files, as a fresh clone has them."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no tracked tree to copy")
    root = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def shell(checkout, tmp_path_factory) -> dict[str, str]:
    """The environment of a user's shell in the checkout: ``pip`` and ``leaf`` on PATH
    from a throwaway virtual environment that sees this interpreter's packages (what
    ``pip install`` adds goes into it), the checkout's code, and an empty task cache."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    inside = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    outer = [*site.getsitepackages(), site.getusersitepackages()]
    Path(inside, "outer-environment.pth").write_text(  # processed like the outer site dirs (.pth files included)
        "".join(f"import site; site.addsitedir({directory!r})\n" for directory in outer))
    for script, entry in (("leaf", "leaf_plugins.cli"), ("pip", "pip._internal.cli.main")):
        path = home / "bin" / script  # what pip writes for a console script
        path.write_text(f"#!{python}\nimport sys\nfrom {entry} import main\nsys.exit(main())\n")
        path.chmod(0o755)
    return {
        **{key: value for key, value in os.environ.items() if not key.startswith("PIP_")},
        "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(checkout),
        "LEAF_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
        "PIP_NO_INDEX": "1",  # the example's dependencies are installed already: nothing to download
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this as build_isolation=0: build with this setuptools, offline
    }


def run(argv: list[str], checkout: Path, shell: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=checkout, env=shell, capture_output=True, text=True)
    assert done.returncode == 0, f"{shlex.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_training_block_runs_as_written(checkout, shell):
    (block,) = [block for block in fenced((checkout / "README.md").read_text(), "bash")
                if "leaf train configs/runs/tiny-qwen2-audio.yaml" in block]
    first, second = commands(block)
    assert first[:2] == second[:2] == ["leaf", "train"]
    run([*first, "steps=1"], checkout, shell)
    assert logged_steps(checkout / "runs" / "tiny-qwen2-audio-leaf") == [1]
    switched = run([*second, "steps=1"], checkout, shell)
    assert switched.stderr.count("leaf train: note:") == 1
    assert ("override 'estimator.name=grpo' switched the estimator to 'grpo', which does not read fork_budget "
            "(configs/runs/tiny-qwen2-audio.yaml:16:5): left out") in switched.stderr
    assert logged_steps(checkout / "runs" / "tiny-qwen2-audio-grpo") == [1]  # its own run, not the LEAF run resumed


@pytest.mark.slow
def test_the_plugin_example_installs_lists_and_trains(checkout, shell):
    readme = (checkout / "README.md").read_text()
    (listed,) = [block for block in fenced(readme, "bash") if "./examples/leaf-rloo" in block]
    example = fenced((checkout / "examples" / "leaf-rloo" / "README.md").read_text(), "bash")[0]
    shown = commands(listed)
    for argv in shown + [argv for argv in commands(example) if argv not in shown]:  # each distinct command once
        done = run([*argv, "steps=1"] if argv[:2] == ["leaf", "train"] else argv, checkout, shell)
        if argv[:2] == ["leaf", "plugins"]:
            assert ["estimator", "rloo", "leaf-rloo"] in [line.split()[:3] for line in done.stdout.splitlines()]
        if argv[:2] == ["leaf", "train"]:
            assert "switched the estimator to 'rloo', which does not read fork_budget" in done.stderr
    assert logged_steps(checkout / "runs" / "tiny-qwen2-audio-rloo") == [1]
    probe = "import importlib.util; print(importlib.util.find_spec('leaf_rloo'))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "None"


@pytest.mark.slow
def test_the_trl_snippet_trains_on_cpu(checkout, monkeypatch):
    from leaf_plugins.integrations.trl import LeafGRPOTrainer

    code = python_block((checkout / "docs" / "integrations.md").read_text(), "LeafGRPOTrainer(\n    model=model")
    monkeypatch.chdir(checkout)
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/integrations.md (Try it on the CPU)", "exec"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer, LeafGRPOTrainer) and trainer.engine.name == "leaf"
    assert trainer.state.global_step == 3
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


@pytest.mark.slow  # two short CLI runs (about 20 s)
def test_the_run_directory_block_runs_in_order(checkout, shell):
    """docs/training.md's block on a run's directory: the run (one step appended), its
    config.yaml checked, and the same run trained on (to 2 steps, appended)."""
    (block,) = [block for block in fenced((checkout / "docs" / "training.md").read_text(), "bash")
                if "config.yaml --check" in block]
    first, check, more = commands(block)
    run([*first, "steps=1"], checkout, shell)
    assert "config.yaml: OK" in run(check, checkout, shell).stdout
    run([*more, "steps=2"], checkout, shell)
    output = first[-1].split("=", 1)[1]
    assert logged_steps(checkout / output) == [1, 2]


@pytest.mark.parametrize("argv", [argv for _, argv in leaf_train_and_study_commands()],
                         ids=[where for where, _ in leaf_train_and_study_commands()])
def test_every_documented_train_and_study_command_validates(argv, checkout, monkeypatch, capsys):
    monkeypatch.chdir(checkout)
    assert main([*argv[1:], "--check"]) == 0, capsys.readouterr().err
    assert "OK" in capsys.readouterr().out


def test_the_advantages_example_gives_the_values_worked_by_hand():
    readme = (REPO / "README.md").read_text()
    code = python_block(readme, "lp.estimate(batch")
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md (Estimate advantages for a batch)", "exec"), namespace)
    result = namespace["result"]
    # LEAF by hand (docs/estimators.md, "Semantics"): lmin = 2 and B = 1 leave the single
    # candidate t = 1; the prefix [5] holds responses 0-2 (V = 2/3, n = 3), [6] is a
    # singleton; V0 = 1/2. Span [0, 1): (GA + LA) / sqrt(3) = (1/6 + 1/6) / sqrt(3); tails
    # (r - V0) + (r - V): 5/6, -7/6, 5/6; response 3 has no node: 2 (r - V0) = -1.
    span = (1 / 3) / 3 ** 0.5
    expected = torch.tensor([[span, 5 / 6, 5 / 6, 5 / 6],
                             [span, -7 / 6, -7 / 6, -7 / 6],
                             [span, 5 / 6, 5 / 6, 0.0],
                             [-1.0, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(result.advantages, expected, rtol=0, atol=1e-6)  # float32 of values near 1
    assert result.boundaries == [[1]]
    (node,) = result.nodes[0]
    assert (node.position, node.members) == (1, (0, 1, 2)) and node.value == pytest.approx(2 / 3)
    shown = [[float(value) for value in re.findall(r"-?\d+\.\d+", line)]
             for line in code.splitlines() if line.startswith("#  [") or line.startswith("# [[")]
    assert torch.tensor(shown).tolist() == expected.mul(1e4).round().div(1e4).tolist()  # the printed output


def test_the_own_estimator_example_registers_and_gives_rloo_times_its_parameter(monkeypatch):
    import types

    import leaf_plugins as lp
    from leaf_plugins.core.plugins import PluginHost

    code = python_block((REPO / "README.md").read_text(), "def register_estimators")
    plugin = types.ModuleType("scaled_rloo_example")
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)  # as an imported module is (dataclasses looks it up)
    exec(compile(code, "README.md (Your own estimator)", "exec", dont_inherit=True), plugin.__dict__)
    host = PluginHost.discover(extra_plugins=[("scaled-rloo-example", plugin)], strict=True)
    batch = lp.RolloutBatch.from_lists(tokens=[[1, 2, 3], [1, 4], [5], [2, 2], [3]],
                                       rewards=[1.0, 0.0, 0.5, 2.0, 4.0], group_ids=[0, 0, 0, 1, 1])
    result = lp.Engine("scaled_rloo", params={"scale": 0.5}, host=host).estimate(batch)
    # RLOO by hand: r_i minus the mean of the group's other rewards, times 0.5
    # group 0: 1 - 0.25, 0 - 0.75, 0.5 - 0.5; group 1: 2 - 4, 4 - 2
    expected = torch.tensor([[0.375, 0.375, 0.375], [-0.375, -0.375, 0.0], [0.0, 0.0, 0.0],
                             [-1.0, -1.0, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(result.advantages, expected, rtol=0, atol=0)  # exact in binary floating point
    with pytest.raises(lp.LeafError, match="scal"):
        lp.Engine("scaled_rloo", params={"scal": 0.5}, host=host)


def test_every_relative_link_of_the_readme_exists():
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into the docs"
    missing = [target for target in local if not (REPO / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def documented_leaf_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every ``leaf`` command in a bash block of the README or the docs."""
    return [(f"{document.relative_to(REPO)}#{number}", argv)
            for document in DOCUMENTS
            for number, block in enumerate(fenced(document.read_text(), "bash"))
            for argv in map(as_leaf_command, commands(block)) if argv[0] == "leaf"]


@pytest.mark.parametrize("argv", [argv for _, argv in documented_leaf_commands()],
                         ids=[where for where, _ in documented_leaf_commands()])
def test_every_documented_leaf_command_parses(argv):
    build_parser().parse_args(argv[1:])  # an unknown command or option exits with status 2
