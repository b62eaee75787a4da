"""Fuzzed run and study files (keys, types, indentation, unicode, huge numbers mutated):
every one is either a valid configuration or a ConfigError located at file:line:col,
never another exception (which the CLI would print as a traceback)."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaf_plugins.core.errors import LeafError
from leaf_plugins.core.plugins import get_host
from leaf_plugins.studies.config import load_study
from leaf_plugins.training.config import load_train_config

SLOW = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SEEDS = {
    "run": [CONFIGS / "runs" / "tiny-qwen2-audio.yaml", CONFIGS / "runs" / "tiny-granite-speech.yaml"],
    "study": [CONFIGS / "studies" / "demo.yaml", CONFIGS / "studies" / "fork-budget-sweep.yaml"],
}
EXAMPLES = {"run": 400, "study": 200}  # LEAF_FUZZ_EXAMPLES=N LEAF_FUZZ_RANDOM=1: a longer, fresh search
SCALE = int(os.environ.get("LEAF_FUZZ_EXAMPLES", 0))
FRESH = os.environ.get("LEAF_FUZZ_RANDOM") == "1"
TALLY: Counter = Counter()  # (kind, "valid" | "rejected") -> files; read by the figures in docs/reliability.md

odd_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["0", "-1", "1e400", "-1e400", ".nan", ".inf", "1.0e-400", "99999999999999999999999999", "0x10",
                     "true", "null", "~", "[]", "{}", "[1, 2]", "{a: 1}", "''", "'ü🙂'", "&a x", "*a", "!!binary x",
                     "leaf", "grpo", "ḟork", "1_000", "2024-01-01", "- x", ": :", "[", "{", "'"]),
    odd_text.map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)


@st.composite
def mutated(draw, kind: str) -> str:
    """One of the kind's seed files with 1 to 4 mutations of keys, values, indentation
    or whole lines."""
    lines = draw(st.sampled_from(SEEDS[kind])).read_text().splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        key, colon, value = line.partition(":")
        action = draw(st.sampled_from(["key", "value", "value", "indent", "insert", "delete", "duplicate", "unicode"]))
        if action == "key" and colon:
            indent = key[: len(key) - len(key.lstrip())]
            lines[at] = indent + draw(st.one_of(odd_text, st.just(key.strip()[:-1]), st.just(key.strip() + "s"))) + \
                colon + value
        elif action == "value" and colon:
            lines[at] = key + ": " + draw(scalars)
        elif action == "indent":
            shift = draw(st.sampled_from(["  ", " ", "\t", "    "]))
            lines[at] = shift + line if draw(st.booleans()) else line[len(shift):] if line.startswith(shift) else line
        elif action == "insert":
            lines.insert(at, draw(odd_text) + draw(st.sampled_from(["", ":", ": ", ": 1"])) + draw(odd_text))
        elif action == "delete" and len(lines) > 1:
            del lines[at]
        elif action == "duplicate":
            lines.insert(at, line)
        else:
            position = draw(st.integers(0, len(line)))
            lines[at] = line[:position] + draw(odd_text) + line[position:]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


def check(kind: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / f"fuzzed-{kind}.yaml"
    path.write_text(text, encoding="utf-8")
    load = load_train_config if kind == "run" else load_study
    try:
        load(path, host=get_host())
    except LeafError as error:
        first, *listed = str(error).splitlines()
        located = re.compile(rf"{re.escape(str(path))}:\d+:\d+: ")
        for line in [line.strip() for line in listed] if " in the configuration:" in first else [first]:
            assert located.match(line), f"unlocated error: {line}\n--- in ---\n{error}\n--- file ---\n{text}"
        TALLY[kind, "rejected"] += 1
    else:
        TALLY[kind, "valid"] += 1


@SLOW
@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_a_fuzzed_file_is_valid_or_rejected_at_file_line_col(kind, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(kind)
    before = Counter(TALLY)

    examples = SCALE or EXAMPLES[kind]

    @settings(max_examples=examples, deadline=None, derandomize=not FRESH, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(text=mutated(kind))
    def fuzz(text: str) -> None:
        check(kind, text, tmp_path)

    fuzz()
    valid, rejected = TALLY[kind, "valid"] - before[kind, "valid"], TALLY[kind, "rejected"] - before[kind, "rejected"]
    print(f"{kind} files: {valid + rejected} tried, {valid} valid, {rejected} rejected at file:line:col")
    assert valid + rejected >= examples and valid > 0 and rejected > 0


@pytest.mark.parametrize("text, location, message", [
    ("base:\n  steps: 2\n  estimator: {name: leaf, params: {fork_budget: banana}}\n", "3:36",
     "variation 'base': estimator.params.fork_budget: fork_budget must be an integer, got 'banana'"),
    ("base: {steps: 2}\ngrid:\n  estimator.params.fork_budget: [1, banana]\n", "3:37",
     "variation 'fork_budget=banana': estimator.params.fork_budget: fork_budget must be an integer, got 'banana'"),
    ("seeds: [-1]\nbase: {steps: 2}\n", "1:1", "seeds: base.seed: must lie in [0, 2147483647], got -1"),
    ("base: {steps: 2}\nvariations:\n  - {label: A, steps: 1}\n  - {label: A, steps: 2}\n", "2:1",
     "two variations are both named 'A'"),
    ("base:\n  rollout: 8\n", "2:3", "base.rollout: expected a section (a mapping of keys), got 8"),
    ("base:\n  optim: {learning_rate: 1e400}\n", "2:11",
     "base.optim.learning_rate: must be a finite number in (0, 1e+06]"),
    ("base: {steps: 2}\n\x07\n", "2:1", "character 0x7 is not allowed in YAML"),
], ids=["params", "grid-params", "seeds", "labels", "section", "inf", "control"])
def test_study_mistakes_the_fuzz_rarely_draws_are_located_too(tmp_path, text, location, message):
    path = tmp_path / "study.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\n" + text)
    line, column = location.split(":")
    with pytest.raises(LeafError) as error:
        load_study(path, host=get_host())
    assert f"{path}:{int(line) + 1}:{column}: {message}" in str(error.value)
