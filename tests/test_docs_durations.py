"""Every place that says how long something takes says the same: one figure per duration.

``QUOTES`` lists, for each duration, the places (README, docs, YAML headers, script
comments) that quote it, each as a pattern around the quoted time. A quote that is
reworded or moved fails here with the place to update; a new quote of one of these
durations must be added to ``QUOTES``, or the scan below fails naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIME = r"(?P<time>(?:about |under |over )?\d+(?:\s*(?:to|–|-)\s*\d+)?\s*(?:minutes?|min)\b)"
"""A quoted duration in minutes: "about 7 minutes", "under 3 min", "8 to 16 minutes"."""
MEASURED = r"(?P<time>\d+ min \d+ s)"
"""A measured duration: "6 min 47 s"."""

INSTALL, DEMO, SUITE, QUICK_TIER = ("bash scripts/install.sh", "leaf study configs/studies/demo.yaml",
                                    "python -m pytest", 'python -m pytest -m "not slow"')
QUOTES: dict[str, list[tuple[str, str]]] = {  # duration -> (file, pattern with the time) of each place quoting it
    INSTALL: [
        ("README.md", r"`scripts/install\.sh` \(" + TIME),
        ("docs/installation.md", r"part of the " + TIME + r" that\s+`scripts/install\.sh` takes"),
        ("scripts/install_verl_env.sh", r"part of the " + TIME + r" that install\.sh takes"),
    ],
    DEMO: [
        ("README.md", r"configs/studies/demo\.yaml +# the main job \(" + TIME),
        ("docs/index.md", r"configs/studies/demo\.yaml +# the main job \(" + TIME),
        ("docs/studies.md", r"configs/studies/demo\.yaml +# the README's main job, " + TIME),
        ("docs/studies.md", r"\| `demo\.yaml` \|[^\n]*\| CPU, " + TIME),
        ("docs/reproducibility.md", r"`leaf study configs/studies/demo\.yaml` takes " + TIME),
        ("docs/tutorial.md", r"It takes " + TIME + " on 2 CPU cores"),
        ("configs/studies/demo.yaml", r"sampled decoding\. " + TIME),
    ],
    SUITE: [
        ("README.md", r"python -m pytest +# the tests \(" + TIME),
        ("docs/index.md", r"python -m pytest +# the tests \(" + TIME),
        ("README.md", r"The test command runs the whole suite \(" + TIME),
        ("docs/contributing.md", r"\| `python -m pytest` \| the whole suite[^|\n]*\| " + TIME),
    ],
    QUICK_TIER: [
        ("README.md", r"is the quick tier for development \(" + TIME),
        ("docs/contributing.md", r"\| `python -m pytest -m \"not slow\"` \| the quick tier[^|\n]*\| " + TIME),
    ],
}
MEASURED_QUOTES: dict[str, list[tuple[str, str]]] = {  # duration -> the places giving its measured time
    DEMO: [
        ("README.md", r"Printed by `leaf study configs/studies/demo\.yaml` \(" + MEASURED),
        ("docs/reproducibility.md", r"something else runs on them: " + MEASURED),
    ],
}
SCANNED = ["README.md", "docs/*.md", "configs/**/*.yaml", "scripts/*.sh"]
MENTIONS = {  # duration -> what a line quoting it names
    INSTALL: r"install(?:_verl_env)?\.sh|the verl environment",
    DEMO: r"demo\.yaml|the main job",
    SUITE: r"python -m pytest|whole suite|the tests\b",
    QUICK_TIER: r"quick tier|not slow",
}


def _quotes(places: list[tuple[str, str]]) -> list[tuple[str, int, int, str]]:
    """(file, start, end, time) of each place; a place that is not found fails, naming it."""
    found = []
    for name, pattern in places:
        match = re.search(pattern, (ROOT / name).read_text(), re.MULTILINE | re.IGNORECASE)
        assert match, f"{name} no longer quotes the duration where /{pattern}/ expects it: update QUOTES"
        found.append((name, match.start("time"), match.end("time"), match["time"]))
    return found


def _minutes(time: str) -> str:
    """The quoted figure, spelt one way: "about 13 min" -> "about 13 minutes"."""
    return re.sub(r"\s*\bmin(?:utes?)?\b", " minutes", time.strip().lower())


@pytest.mark.parametrize("duration", QUOTES)
def test_every_place_quotes_the_same_figure(duration):
    quotes = _quotes(QUOTES[duration])
    figures = {_minutes(time) for *_, time in quotes}
    assert len(figures) == 1, f"{duration!r} is quoted as " + "; ".join(
        f"{time!r} in {name}" for name, _, _, time in quotes) + ": use one figure everywhere"


@pytest.mark.parametrize("duration", MEASURED_QUOTES)
def test_a_measured_time_is_the_same_everywhere_and_rounds_to_the_quoted_figure(duration):
    measured = {time for *_, time in _quotes(MEASURED_QUOTES[duration])}
    assert len(measured) == 1, f"{duration!r}: the measured time differs between places: {sorted(measured)}"
    minutes, seconds = map(int, re.findall(r"\d+", measured.pop()))
    quoted = _minutes(_quotes(QUOTES[duration])[0][3])
    assert quoted == f"about {round(minutes + seconds / 60)} minutes", (duration, quoted)


def test_no_other_place_quotes_these_durations():
    """A line that names one of these durations' commands next to a time in minutes is one
    of the places in ``QUOTES`` (so a new quote cannot drift from the others unseen)."""
    known = {(name, start) for places in (*QUOTES.values(), *MEASURED_QUOTES.values())
             for name, start, _, _ in _quotes(places)}
    unknown = []
    for path in sorted({path for pattern in SCANNED for path in ROOT.glob(pattern)}):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        offset = 0
        for line in text.splitlines(keepends=True):
            for match in re.finditer(TIME, line):
                mentioned = [duration for duration, words in MENTIONS.items() if re.search(words, line, re.IGNORECASE)]
                if mentioned and (name, offset + match.start("time")) not in known:
                    unknown.append(f"{name}: {line.strip()!r} ({', '.join(mentioned)})")
            offset += len(line)
    assert not unknown, "durations quoted outside QUOTES (add each to QUOTES, or reword it):\n" + "\n".join(unknown)
