"""The docs' reference pages are generated from the code (scripts/docs_reference.py, a
MkDocs hook): every registered estimator with each parameter it reads, every config key
with its default and help, every command's options."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from leaf_plugins.core.plugins import get_host

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docs_reference.py"


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("docs_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(markdown: str, heading: str) -> dict[str, list[str]]:
    """``first cell -> cells`` of the table under ``## heading`` (up to the next ``## ``)."""
    text = markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_registered_estimator_has_its_parameters_listed(reference):
    page = reference.estimators_page()
    registry = get_host().estimators
    assert registry.names(), "the built-ins are registered"
    for name in registry.names():
        declared = getattr(registry.get(name), "parameters", ())
        names = ({field.name for field in dataclasses.fields(declared)} if dataclasses.is_dataclass(declared)
                 else set(declared))
        listed = set(table_rows(page, f"`{name}`")) if names else set()
        assert listed == names, name


def test_the_paper_defaults_appear_in_the_estimator_and_config_pages(reference):
    # the paper's LEAF defaults (B = 2, m0 = 2) and Table 7 (K = 8, lr 5e-6, LoRA rank 64, alpha 128)
    leaf = table_rows(reference.estimators_page(), "`leaf`")
    assert leaf["fork_budget"][2] == "`2`" and leaf["min_group"][2] == "`2`"
    run = table_rows(reference.config_page(), "Run files (`leaf train`)")
    assert run["rollout.group_size"][2] == "`8`"
    assert float(run["optim.learning_rate"][2].strip("`")) == 5e-6
    assert (run["lora.rank"][2], run["lora.alpha"][2]) == ("`64`", "`128`")
    assert run["rollout.group_size"][3] == "K"  # the comment beside the field is its help


def test_field_help_comes_from_metadata_or_the_comment_beside_the_field(reference):
    @dataclasses.dataclass(frozen=True)
    class Example:
        plain: int = 3  # a comment | with a bar
        helped: float = dataclasses.field(default=0.5, metadata={"help": "from metadata"})  # ignored
        bare: str = "x"

    rows = {row.split("|")[1].strip(" `"): row for row in reference.schema_rows(Example)}
    assert rows["plain"] == "| `plain` | `int` | `3` | a comment \\| with a bar |"
    assert rows["helped"].endswith("| from metadata |")
    assert rows["bare"].endswith("| `'x'` |  |")


def test_the_cli_page_has_every_command_and_nested_command(reference):
    page = reference.cli_page()
    for command in ("train", "study", "eval", "forkability", "plugins", "tasks", "warm-start",
                    "bench speed", "bench credit", "bench step", "bench rollout", "eval generate", "eval report"):
        assert f"\n## `leaf {command}`\n" in page, command
    assert "--held-out" in page  # an option deep in `leaf bench credit`
