"""``leaf runs``: watch and compare training runs from what their directories hold: list
the runs under folders, compare their metrics, plot a metric per step. It reads files
only, so it runs beside a training run, and listing and comparing need no ``train`` extra."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any, Sequence

from leaf_plugins.commands import written_line
from leaf_plugins.core.errors import ConfigError, ConfigNotice

NAME = "runs"
HELP = ("List the training runs under folders (estimator, steps done of planned, last reward, state), compare "
        "runs' metrics side by side, or plot a metric per step; reads the run directories only.")
EPILOG = """forms:
  leaf runs FOLDER [FOLDER ...]             a row per training run under the folders
  leaf runs compare RUN [RUN ...]           the runs' metrics side by side at their last step
  leaf runs plot RUN [RUN ...] --metric M   a PNG of metric M per step, a line per run

The first word picks the form: compare or plot, else it is the first FOLDER to list.
To list a folder named compare, plot or list, write ./compare or leaf runs list compare.

examples:
  leaf runs runs/studies/demo
  leaf runs compare runs/tiny-qwen2-audio-leaf runs/tiny-qwen2-audio-grpo
  leaf runs plot runs/tiny-qwen2-audio-leaf runs/tiny-qwen2-audio-grpo --metric reward_mean

leaf runs FOLDER --help, leaf runs compare --help and leaf runs plot --help tell more."""

LIST = "list"  # the form a first word that names no form takes
STATE_HELP = ("state: finished, interrupted (Ctrl-C, SIGTERM: resumable), failed, running, stopped (its process "
              "was killed outright: resumable) or unknown (no status.json)")


class _AnyWord(dict):
    """The forms by name, as choices that admit any first word (argparse checks the first
    word against the choices before the action sees it): one that names no form is a FOLDER."""

    def __contains__(self, word: object) -> bool:
        return True


class _FolderOrForm(argparse._SubParsersAction):
    """The sub-parsers of ``leaf runs``, where a first word that names no form is the
    first FOLDER of the list form (``leaf runs FOLDER`` is ``leaf runs list FOLDER``)."""

    def admit_folders(self) -> None:
        """Once every form is added: let any first word through argparse's check of choices."""
        self.choices = _AnyWord(self._name_parser_map)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values and values[0] not in self._name_parser_map:
            values = [LIST, *values]
        super().__call__(parser, namespace, values, option_string)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    forms = parser.add_subparsers(action=_FolderOrForm, dest="form", required=True, metavar="FOLDER|compare|plot",
                                  help="a folder to list (the list form), or the form: compare or plot")
    listed = forms.add_parser(
        LIST, help="a row per training run under the folders (the form FOLDER ... takes)",
        description="A row per training run found at or below each FOLDER (a directory with config.yaml and "
                    "metrics.jsonl or status.json; a study's runs lie under its runs/), sorted by path: the run "
                    "(its path relative to the folder; with several folders, the folder's path before it), its "
                    "estimator, steps done/planned, the last step's reward_mean, and its " + STATE_HELP + ".",
        epilog="examples:\n  leaf runs runs/studies/demo\n  leaf runs runs/tiny-qwen2-audio-leaf runs/studies",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    listed.add_argument("folders", type=Path, nargs="+", metavar="FOLDER",
                        help="a run directory or a folder with runs below it (a study's output folder)")
    listed.set_defaults(show=run_list)
    compared = forms.add_parser(
        "compare", help="the runs' metrics side by side: a row per metric, a column per run",
        description="A row per metric, a column per run: the values of each run's last logged step (--step N: "
                    "of step N), every metric all the runs logged there, the wall-clock ones (seconds, tokens "
                    "per second, peak memory) only with --all. The first row is the step the values are from.",
        epilog="examples:\n  leaf runs compare runs/tiny-qwen2-audio-leaf runs/tiny-qwen2-audio-grpo\n"
               "  leaf runs compare runs/tiny-qwen2-audio-leaf runs/tiny-qwen2-audio-grpo --step 10 --all",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    compared.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="a run directory (leaf train's output_dir)")
    compared.add_argument("--step", type=int, metavar="N", help="compare at step N (default: each run's last step)")
    compared.add_argument("--all", action="store_true", dest="wall_clock",
                          help="also the wall-clock metrics, which measure the machine, not the training")
    compared.set_defaults(show=run_compare)
    plotted = forms.add_parser(
        "plot", help="a PNG of metrics against the step, a line per run",
        description="Write a PNG of each --metric against the training step: a panel per metric, a line per run "
                    "(named in the legend by its path without the directories all the runs share).",
        epilog="examples:\n  leaf runs plot runs/tiny-qwen2-audio-leaf runs/tiny-qwen2-audio-grpo --metric reward_mean"
               "\n  leaf runs plot runs/studies/demo/runs/estimator=leaf/seed-0 --metric reward/sentence_bleu "
               "--metric kl --out kl.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    plotted.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="a run directory (leaf train's output_dir)")
    plotted.add_argument("--metric", action="append", required=True, metavar="NAME", dest="metrics",
                         help="a metric of metrics.jsonl, e.g. reward_mean or reward/sentence_bleu; repeatable")
    plotted.add_argument("--out", type=Path, metavar="PATH.png",
                         help="the PNG to write (default: runs-METRIC.png in the current directory, '/' in a "
                              "metric's name written as '_')")
    plotted.set_defaults(show=run_plot)
    forms.admit_folders()


def run(args: argparse.Namespace) -> int:
    return int(args.show(args))


def run_list(args: argparse.Namespace) -> int:
    """``leaf runs [list] FOLDER ...``: print a row per run found under each folder."""
    from leaf_plugins.training.run_directory import find_runs, summarise

    rows = [("run", "estimator", "steps", "reward_mean", "state")]
    several = len(args.folders) > 1
    for folder in args.folders:
        found = find_runs(folder)
        if not found:
            raise ConfigError(f"{folder}: no training runs in it or below it (a run directory holds config.yaml "
                              "and metrics.jsonl or status.json)")
        for run_dir in found:
            row = summarise(run_dir)
            relative = run_dir.relative_to(folder)
            name = str(folder / relative if several or relative == Path(".") else relative)
            planned = "?" if row.planned is None else str(row.planned)
            reward = "-" if row.reward_mean is None else f"{row.reward_mean:.4f}"
            rows.append((name, row.estimator or "?", f"{row.done}/{planned}", reward, row.state))
    print(_table(rows))
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``leaf runs compare RUN ...``: print the runs' metrics, a row per metric."""
    from leaf_plugins.training.run_directory import compare

    found = compare(args.runs, args.step, args.wall_clock)
    rows = [("metric", *found.names), ("step", *map(str, found.steps))]
    rows += [(metric, *map(_cell, values)) for metric, values in zip(found.metrics, found.values)]
    print(_table(rows, numbers=True))
    if found.partial:
        print(f"not logged by every run at that step: {', '.join(found.partial)}")
    if found.wall_clock:
        print(f"wall-clock metrics left out (--all shows them): {', '.join(found.wall_clock)}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """``leaf runs plot RUN ... --metric NAME``: write the PNG and say where."""
    from leaf_plugins.training.run_curves import default_plot_path, plot_runs
    from leaf_plugins.training.run_directory import metric_series, read_metrics, run_names

    metrics = list(dict.fromkeys(args.metrics))  # each once, in the order given
    out = args.out or default_plot_path(metrics)
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out}: the plot is a PNG; name a .png file")
    logs = {name: read_metrics(run_dir) for name, run_dir in zip(run_names(args.runs), args.runs)}
    curves = {}
    for metric in metrics:
        curves[metric] = metric_series(logs, metric)
        for name in (name for name in logs if name not in curves[metric]):
            warnings.warn(f"{name} logged no {metric}: not in its panel", ConfigNotice, stacklevel=1)
    print(written_line([plot_runs(curves, out)]))
    return 0


def _cell(value: Any) -> str:
    """A metric's value as the compare table shows it (six significant digits)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _table(rows: Sequence[Sequence[str]], numbers: bool = False) -> str:
    """``rows`` in aligned columns (``numbers``: every column but the first right-aligned)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(width) if numbers and column else cell.ljust(width)
                 for column, (cell, width) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
