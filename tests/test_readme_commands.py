"""The README's examples, extracted from README.md itself (so an edit of the README is
what gets tested) and run on a fresh copy of the tracked tree, as a new user would:

- the "Training" block, each command as written with ``steps=1`` appended (the block's
  first command trains 20 steps, minutes on 2 CPU cores: too long for CI; an appended
  override wins over the file and over the earlier overrides, so everything else is as
  written);
- the plugin example (``pip install ./examples/leaf-rloo && leaf plugins --kind
  estimator``) and the example's own README, installed into a throwaway environment
  that sees this one's packages, so this environment is never changed;
- the TRL snippet of "Use with TRL / verl";
- every ``leaf train`` and ``leaf study`` command of the README's and docs' bash blocks,
  validated with ``--check`` (their runs are minutes to hours long).
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

from leaf_plugins.cli import main

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # the plugin's README: in the plugin test


def fenced(markdown: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of ``markdown``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, re.M | re.S)


def section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


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


def leaf_train_and_study_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every ``leaf train|study`` command in a bash block of the docs."""
    found = []
    for document in DOCUMENTS:
        for number, block in enumerate(fenced(document.read_text(), "bash")):
            for argv in commands(block):
                if argv[:2] in (["leaf", "train"], ["leaf", "study"]):
                    found.append((f"{document.relative_to(REPO)}#{number}", argv))
    return found


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
    block = fenced(section((checkout / "README.md").read_text(), "Training"), "bash")[0]
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

    code = fenced(section((checkout / "README.md").read_text(), "Use with TRL / verl"), "python")[0]
    monkeypatch.chdir(checkout)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md (Use with TRL / verl)", "exec"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer, LeafGRPOTrainer) and trainer.engine.name == "leaf"
    assert trainer.state.global_step == 3
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


@pytest.mark.parametrize("argv", [argv for _, argv in leaf_train_and_study_commands()],
                         ids=[where for where, _ in leaf_train_and_study_commands()])
def test_every_documented_train_and_study_command_validates(argv, checkout, monkeypatch, capsys):
    monkeypatch.chdir(checkout)
    assert main([*argv[1:], "--check"]) == 0, capsys.readouterr().err
    assert "OK" in capsys.readouterr().out
