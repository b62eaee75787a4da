"""Reference pages of the docs site, generated from the code at build time (a MkDocs hook,
named in mkdocs.yml), so they cannot drift from it:

- ``reference/cli.md``: the ``leaf`` command and every sub-command's ``--help``;
- ``reference/config.md``: every key of a run, study and warm-start file, with its type,
  default and the comment or ``metadata["help"]`` beside the field;
- ``reference/estimators.md``: every registered estimator, its package, its description
  and its parameters (type, default, help).

``python scripts/docs_reference.py DIR`` writes the three pages into ``DIR`` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Iterator

PAGES = ("reference/cli.md", "reference/config.md", "reference/estimators.md")
REPO = Path(__file__).resolve().parents[1]


def use_this_checkout() -> None:
    """Import ``leaf_plugins`` from this checkout, whichever copy is installed (called at
    build time: MkDocs takes its own entry off ``sys.path`` after loading a hook)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    loaded = sys.modules.get("leaf_plugins")
    if loaded is not None and Path(loaded.__file__).resolve().parents[1] != REPO:
        raise RuntimeError(f"leaf_plugins was imported from {loaded.__file__}, not from {REPO}")


# ---------------------------------------------------------------------------- the CLI
def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(name, parser)`` of every sub-command below ``parser``, depth first."""
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield name, child
                yield from ((f"{name} {grand}", p) for grand, p in _subcommands(child))


def cli_page() -> str:
    """``leaf --help`` and every sub-command's help, as the terminal prints it."""
    import os

    from leaf_plugins.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps to this width
    parser = build_parser()
    out = ["# Command line (`leaf`)", "",
           "Generated from the argument parser at build time: the same text as `leaf COMMAND --help`.",
           "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, child in _subcommands(parser):
        out += [f"## `leaf {name}`", "", "```text", child.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------- config schema
def field_comments(cls: type) -> dict[str, str]:
    """The ``# comment`` on the line of each field of the dataclass ``cls``, with the
    comment-only lines that continue it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined where no source file is (exec, an interactive session)
        return {}
    comments: dict[int, str] = {}
    starts: dict[int, str] = {}
    line_start = True
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type == tokenize.NAME and line_start and token.start[1] > 0:
            starts.setdefault(token.start[0], token.string)
        line_start = token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    names = {field.name for field in dataclasses.fields(cls)}
    found = {}
    for line, name in starts.items():
        if name in names and line in comments:
            text, following = [comments[line]], line + 1
            while following in comments and following not in starts:  # a comment continued on lines of its own
                text.append(comments[following])
                following += 1
            found[name] = " ".join(text)
    return found


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
        return "(section)" if dataclasses.is_dataclass(value) else f"`{value!r}`"
    return "required"


def _type(field: dataclasses.Field) -> str:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    return f"`{kind}`".replace("|", "\\|")


def schema_rows(cls: type, prefix: str = "") -> list[str]:
    """Markdown table rows ``| key | type | default | meaning |`` for the dataclass ``cls``,
    nested dataclass sections as dotted keys."""
    rows = []
    comments = field_comments(cls)
    for field in dataclasses.fields(cls):
        key = f"{prefix}{field.name}"
        value = field.default_factory() if field.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            rows += schema_rows(type(value), f"{key}.")
            continue
        meaning = field.metadata.get("help") or comments.get(field.name, "")
        rows.append(f"| `{key}` | {_type(field)} | {_default(field)} | {meaning.replace('|', chr(92) + '|')} |")
    return rows


def config_page() -> str:
    """Every key of the three YAML file kinds."""
    from leaf_plugins.studies.config import StudyConfig
    from leaf_plugins.training.config import TrainConfig
    from leaf_plugins.training.warm_start import WarmStartConfig

    out = ["# Configuration files", "",
           "Generated from the configuration dataclasses at build time. Every key can also be set",
           "on the command line as `key.sub=value` (for example `rollout.group_size=4`). A mistake",
           "is reported at `file:line:col`; see [Training](../training.md) and [Studies](../studies.md)",
           "for what the options do together.", ""]
    header = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for title, cls, note in (
        ("Run files (`leaf train`)", TrainConfig, "A run file such as `configs/runs/tiny-qwen2-audio.yaml`."),
        ("Study files (`leaf study`)", StudyConfig,
         "`base` and each variation are run files (the keys above); `grid` maps run keys to lists of values."),
        ("Warm-start files (`leaf warm-start`)", WarmStartConfig, "Supervised fine-tuning before RL."),
    ):
        out += [f"## {title}", "", (cls.__doc__ or "").strip().split("\n")[0] + " " + note, "",
                *header, *schema_rows(cls), ""]
    return "\n".join(out)


# ------------------------------------------------------------------------- estimators
def estimator_parameters(name: str, estimator: Any) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` of each parameter of estimator ``name``, from its
    ``parameters`` dataclass (``leaf_plugins.core.parameters`` reads it as ``leaf plugins``
    does; a field without help text falls back to the comment on its line)."""
    from leaf_plugins.core.parameters import parameter_list, parameters_class

    declared = parameters_class(name, estimator)
    comments = field_comments(declared)
    return [(p.name, f"`{p.type_text}`".replace("|", "\\|"), f"`{p.default_text}`",
             p.help or comments.get(p.name, "")) for p in parameter_list(declared, name)]


def estimators_page() -> str:
    """One section per registered estimator, in name order."""
    from leaf_plugins.core.plugins import get_host

    registry = get_host().estimators
    out = ["# Estimators and their parameters", "",
           "Generated at build time from the estimator registry (`leaf plugins --kind estimator`",
           "lists the same): every estimator registered in this environment, built-in or installed.",
           "Set a parameter with `estimator.params.NAME: value` in a run file, "
           "`estimator.params.NAME=value` on the command line, or `lp.estimate(batch, NAME, **params)`.",
           "What each computes: [The estimators](../estimators.md).", ""]
    for name in registry.names():
        entry = registry.entry(name)
        doc = inspect.getdoc(entry.value) or ""
        out += [f"## `{name}`", "", f"From the package `{entry.origin}`.", "", doc, "",
                estimator_reads(entry.value), ""]
        rows = estimator_parameters(name, entry.value)
        if rows:
            out += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
            out += [f"| `{p}` | {t} | {d} | {h.replace('|', chr(92) + '|')} |" for p, t, d, h in rows]
        else:
            out.append("No parameters.")
        out.append("")
    return "\n".join(out)


def estimator_reads(estimator: Any) -> str:
    """What an estimator declares it reads of the batch (``requires``, per stage), in one line."""
    from leaf_plugins.core.engine import declared_requires
    from leaf_plugins.core.hookspecs import ESTIMATOR_STAGES

    declared = declared_requires(estimator)
    if declared is None:
        reads = "Reads: undeclared (every optional per-token field is computed for it)."
    else:
        used = [f"{', '.join(f'`{field}`' for field in declared[stage])} ({stage})" for stage in ESTIMATOR_STAGES
                if declared[stage]]
        reads = f"Reads: {'; '.join(used)}." if used else "Reads: the rewards only (no optional per-token field)."
    return reads


def pages() -> dict[str, str]:
    """Every generated page by its path under docs/."""
    use_this_checkout()
    return dict(zip(PAGES, (cli_page(), config_page(), estimators_page())))


# ----------------------------------------------------------------------- MkDocs hook
def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the site."""
    from mkdocs.structure.files import File

    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("site-reference")
    for path, content in pages().items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(content)
        print(f"written: {target / path}")
