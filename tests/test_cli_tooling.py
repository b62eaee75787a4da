"""The ``leaf`` tool's own surface: a package's command says which package it comes from,
``Command`` is part of the public API, ``leaf bench speed`` runs at a thread count it
states, and the credit benchmark's regime counts in the docs are the code's."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import leaf_plugins as lp
from leaf_plugins.bench.speed import SpeedRow, speed_caption
from leaf_plugins.cli import build_parser, main
from leaf_plugins.core import command
from written_files import run_naming_every_file_written

ROOT = Path(__file__).resolve().parents[1]


def help_text(parser) -> str:  # type: ignore[no-untyped-def]
    """A parser's help with argparse's line wrapping undone."""
    return " ".join(parser.format_help().split())


def subcommand(parser, name: str):  # type: ignore[no-untyped-def]
    """The sub-parser of ``leaf NAME``."""
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices[name]


def test_command_is_exported():
    assert lp.Command is command.Command
    assert "Command" in lp.__all__ and "Command" in dir(lp)
    made = lp.Command("Say hello.", lambda parser: None, lambda args: 0)
    assert (made.help, made.epilog) == ("Say hello.", None)


def test_built_in_commands_name_no_package():
    assert "(from " not in help_text(build_parser())


@pytest.mark.slow  # installs the example package (seconds)
def test_help_names_the_package_of_a_command_that_is_not_built_in(tmp_path, monkeypatch):
    source = tmp_path / "leaf-checkpoints"  # copied: pip builds in the tree
    shutil.copytree(ROOT / "examples" / "leaf-checkpoints", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                    "--disable-pip-version-check", "--target", str(site), str(source)], check=True)
    monkeypatch.syspath_prepend(str(site))  # its entry point is found like an installed package's
    parser = build_parser()
    overview = help_text(parser)
    assert ("checkpoints List training runs' checkpoints (steps, newest) and the plugins they name. "
            "(from leaf-checkpoints)") in overview
    assert overview.count("(from ") == 1  # the built-ins name none
    assert help_text(subcommand(parser, "checkpoints")).count("(from leaf-checkpoints)") == 1  # its --help too


def test_bench_speed_defaults_to_one_thread_and_refuses_zero(capsys):
    args = build_parser().parse_args(["bench", "speed"])
    assert args.threads == 1
    assert main(["bench", "speed", "--threads", "0"]) == 2
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err


def test_the_speed_caption_states_the_recorded_thread_counts():
    rows = [SpeedRow("s", "grpo", 1.0, 1.0, 10, 1), SpeedRow("s", "leaf", 2.0, 2.0, 10, 1)]
    assert speed_caption(rows) == "Estimators on the CPU at 1 torch CPU thread (--threads)."
    rows.append(SpeedRow("s", "otb", 1.0, 1.0, 10, 3))
    assert speed_caption(rows, "an H100") == "Estimators on an H100 at 1 and 3 torch CPU threads (--threads)."
    assert speed_caption([SpeedRow("s", "grpo", 1.0, 1.0, 10)]) == "Estimators on the CPU; thread count not recorded."


@pytest.mark.slow  # runs the speed suite once for one estimator (about 15 s)
def test_bench_speed_runs_at_the_thread_count_it_states(tmp_path, capsys):
    printed = run_naming_every_file_written(["bench", "speed", "--threads", "2", "--repeats", "1", "--quick",
                                             "--estimator", "grpo", "--out", str(tmp_path)], tmp_path, capsys)
    assert "threads: 2" in printed
    recorded = json.loads((tmp_path / "speed-1.json").read_text())["benchmarks"]
    assert recorded and {bench["extra_info"]["threads"] for bench in recorded} == {2}
    assert (tmp_path / "speed.md").read_text().splitlines()[0] == \
        "Estimators on the CPU at 2 torch CPU threads (--threads)."


def test_every_written_line_is_built_from_the_paths_written():
    """A command's ``written:`` line comes from ``commands.written_line`` of the paths its
    writing code returned or used, never from file names spelt out again beside it."""
    spelt = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "leaf_plugins").rglob("*.py"))
             if path != ROOT / "leaf_plugins" / "commands" / "__init__.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"[\"'](?:\\n)*written:", line)]  # the line's text in a string
    assert spelt == [], f"print commands.written_line(paths) instead: {spelt}"


def test_credit_help_and_docs_count_the_regimes_the_code_defines():
    from leaf_plugins.bench.credit.sweep import held_out_regimes, regimes

    credit_help = help_text(subcommand(subcommand(build_parser(), "bench"), "credit"))
    assert not re.search(r"\d+ regimes", credit_help)  # a count in the help would go stale
    docs = " ".join((ROOT / "docs" / "credit-benchmark.md").read_text().split())
    sweep = [int(n) for n in re.findall(r"(?:for the|Over the|all) (\d+) regimes", docs)]
    assert sweep and set(sweep) == {len(regimes())}
    design = [int(n) for n in re.findall(r"all (\d+) design regimes", docs)]
    assert design == [len(regimes()) + len(held_out_regimes())]
