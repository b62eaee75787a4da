"""Study files: a base run config, the variations to run, seeds, and how to evaluate.

```yaml
output_dir: runs/studies/demo
warm_start: configs/warm-start/tiny-qwen2-audio-translation.yaml   # optional
base: {...}                                # a run config, as for `leaf train` (include: a recipe, say)
grid: {estimator.name: [grpo, leaf]}       # the cross product of these values (plugins.NAME.PARAM: a parameter
                                           # of plugin NAME, which the run's plugins: must name)
variations:                                # and/or a list of labelled settings
  - {label: GA only, estimator.params.terms: ga}
seeds: [0, 1, 2]
compare_to: estimator=grpo                 # the baseline of the paired differences: a variation's label, or
                                           # a grid setting (each variation vs the one differing only there)
evaluation:
  split: validation
  runs: 1
  judges:                                  # optional LLM judges of every run (off unless a model is named)
    da: {model: Qwen/Qwen2.5-14B-Instruct, device: cuda, dtype: bfloat16}
    likert: {model: Unbabel/M-Prometheus-14B, device: cuda, dtype: bfloat16}
```

Every mistake in the file is reported at once with ``file:line:col``; grid and variation
values are checked by building the run config they make.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ruamel.yaml.comments import CommentedMap

from leaf_plugins.core.config import (build_collecting, format_errors, key_location, load_yaml, parse_overrides,
                                      resolve_includes, set_dotted)
from leaf_plugins.core.errors import ConfigError, suggest
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.evaluation.text_metrics import METRICS
from leaf_plugins.training.config import (EstimatorConfig, TrainConfig, named_parameter_problems, rollout_field_problem,
                                          train_validators)
from leaf_plugins.training.estimator_switch import announce_dropped, apply_layer, estimator_problems
from leaf_plugins.training.stage_plugins import apply_plugin_settings, plugin_setting
from leaf_plugins.training.warm_start import WarmStartConfig, warm_start_validators

__all__ = ["EvaluationSettings", "JudgeSettings", "JudgesSettings", "StudyConfig", "PlannedRun", "Study", "load_study",
           "slug"]

LABEL = "label"  # the reserved key of a variation that names it


@dataclass
class JudgeSettings:
    """One absolute LLM judge of a study's runs (off while ``model`` is None); None keeps
    the protocol's default (DA: 5 samples at 0.7; Likert: one greedy judgment)."""

    model: str | None = None  # hub id or local directory of a causal LM
    samples: int | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    task: str = "auto"  # qa or translation; auto: translation for tasks named *translation* or covost*
    chat_template: bool = True  # use the judge's chat template when it has one
    seed: int = 0


@dataclass
class JudgesSettings:
    """The paper's two absolute judges, each scoring the first decoding run of every run."""

    da: JudgeSettings = field(default_factory=JudgeSettings)
    likert: JudgeSettings = field(default_factory=JudgeSettings)


@dataclass
class EvaluationSettings:
    """Held-out evaluation of every run: the paper's sampled decoding by default."""

    split: str = "validation"
    limit: int | None = None  # only the first N examples of the split
    runs: int = 1  # sampled decoding runs averaged (the paper: N runs)
    temperature: float = 0.9
    top_p: float = 0.9
    max_new_tokens: int = 200
    batch_prompts: int = 8  # examples per generate call
    seed: int = 0  # the same sampling seed for every run (common random numbers)
    metrics: list[str] = field(default_factory=lambda: ["bleu", "length"])
    fork_budget: int | None = None  # B of the forkability analysis of the training rollouts; unset: each run's
    # own estimator.params.fork_budget (its config.yaml), else 2
    tau: float = 0.0  # reward-spread tolerance of a usable fire
    judges: JudgesSettings = field(default_factory=JudgesSettings)


@dataclass
class StudyConfig:
    """A study file (``base`` and the variations are checked as run configs)."""

    output_dir: str = "runs/studies/study"
    warm_start: Any = None  # a warm-start YAML path or mapping; its model becomes backbone.path
    baseline: bool = True  # also evaluate the starting model (no RL), for deltas
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, Any] = field(default_factory=dict)
    variations: list[Any] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    compare_to: str | None = None  # the paired differences' baseline: a variation label or a grid `key=value`
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a study."""

    variation: str  # label shown in the table
    seed: int
    config: TrainConfig
    settings: dict[str, Any]  # the varied keys and their values

    @property
    def directory(self) -> Path:
        return Path(self.config.output_dir)


@dataclass(frozen=True)
class Study:
    """A validated study: its settings, the warm start to run first, and every run."""

    path: Path
    config: StudyConfig
    warm_start: WarmStartConfig | None
    runs: list[PlannedRun]

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir)

    @property
    def variations(self) -> list[str]:
        return list(dict.fromkeys(run.variation for run in self.runs))

    def baseline_of(self, variation: str) -> str | None:
        """The variation ``variation`` is compared with: ``compare_to`` when it is a label
        (default: the first variation); for a setting ``name=value`` (``estimator=grpo``,
        ``fork_budget=2``: a key's last part, as in labels) the variation whose settings
        equal ``variation``'s except that key, which has that value; None when none does."""
        target = self.config.compare_to or self.variations[0]
        if target in self.variations:
            return target
        name, _, value = target.partition("=")
        settings = {run.variation: run.settings for run in self.runs}
        mine = settings[variation]
        for key in [key for key in mine if _short(key) == name]:
            for other, theirs in settings.items():
                if theirs.keys() == mine.keys() and str(theirs[key]) == value and all(
                        theirs[k] == mine[k] for k in mine if k != key):
                    return other
        return None


def slug(label: str) -> str:
    """A directory name for a label: lowercase, runs of other characters become ``-``."""
    return re.sub(r"[^a-z0-9_.=]+", "-", label.lower()).strip("-") or "base"


def load_study(path: Path, overrides: Iterable[str] = (), host: PluginHost | None = None) -> Study:
    """Read and check a study file; ``a.b=value`` overrides apply to the study
    (``base.steps=10``, ``seeds=[0]``). Raises one ``ConfigError`` listing every mistake
    in line order. A grid cell, variation or override that sets ``estimator.name`` switches
    the estimator: the earlier parameters it does not read are left out, all named in one
    ``ConfigNotice`` warning (``training/estimator_switch.py``)."""
    host = host or get_host()
    where = str(path)
    data = load_yaml(path)
    resolve_includes(data.get("base"), Path(path))  # the base's recipe, say
    settings, errors = parse_overrides(overrides)
    sets_plugin = [key.startswith("base.") and plugin_setting(key.removeprefix("base.")) is not None
                   for key, _, _ in settings]  # base.plugins.NAME.PARAM
    found, switched = apply_layer(data, [s for s, plugin in zip(settings, sets_plugin) if not plugin], where, host,
                                  run="base.")
    errors += found
    base_plugin_settings = [(key.removeprefix("base."), value, at)  # set on each run's copy (a copy keeps no marks)
                            for (key, value, at), plugin in zip(settings, sets_plugin) if plugin]
    dropped = [switched] if switched else []
    study, found = build_collecting(StudyConfig, data, where, {"evaluation.metrics": _known_metrics,
                                                               **_judge_validators()})
    errors += found
    base = data.get("base") if isinstance(data.get("base"), CommentedMap) else CommentedMap()
    warm, found = _warm_start(data, where, host)
    errors += found
    if warm is not None:  # its model is where the runs start
        set_dotted(base, "backbone.path", str(Path(warm.output_dir) / "model"), f"{where}: warm_start")
        set_dotted(base, "backbone.name", warm.backbone.name, f"{where}: warm_start")
    validators = train_validators(host, prefix="base.")
    _, found = build_collecting(TrainConfig, base, where, validators, prefix="base.")
    errors += found
    variations, found = _variations(data, where)
    errors += found
    runs, sections = [], []  # each run, and its estimator section as set (for the locations of its parameters)
    reported: set[tuple[str, str]] = set()  # parameter problems of the other named objects, each reported once
    for label, settings, located in variations:
        for seed in study.seeds:
            tree = copy.deepcopy(base)
            layer = [(key, value, at) for key, (value, at) in located.items()]
            found, switched = apply_layer(tree, [setting for setting in layer if not plugin_setting(setting[0])],
                                          where, host)
            errors += found
            for problem in apply_plugin_settings(tree, [*base_plugin_settings,
                                                        *[setting for setting in layer if plugin_setting(setting[0])]]):
                if problem not in errors:  # an override's mistake: once
                    errors.append(problem)
            if switched:
                dropped.append(dataclasses.replace(switched, switched_at=f"variation {label!r} ({switched.switched_at})"))
            set_dotted(tree, "seed", seed, f"{_key_where(data, 'seeds', where)}: seeds")
            set_dotted(tree, "log_rollouts", True, f"{where}: (studies log rollouts)")
            run_dir = Path(study.output_dir) / "runs" / slug(label) / f"seed-{seed}"
            set_dotted(tree, "output_dir", str(run_dir), f"{_key_where(data, 'output_dir', where)}: output_dir")
            config, found = build_collecting(TrainConfig, tree, where, validators, prefix="base.")
            errors += found
            runs.append(PlannedRun(label, seed, config, settings))
            sections.append(tree.get("estimator") or {})
            for at, message in named_parameter_problems(tree, where, host):
                if (at, message) not in reported:  # a mistake in the base: once, with the first variation it spoils
                    reported.add((at, message))
                    errors.append(f"{at}: variation {label!r}: {message}")
    errors += _compare_to_problems(study.compare_to, runs, data, where)
    errors += _estimator_problems(runs, sections, where, host)
    if not errors:
        errors += _rollout_field_problems(runs, where, host)
    if errors:
        raise ConfigError(format_errors(where, errors))
    announce_dropped(dropped)
    return Study(Path(path), study, warm, runs)


def _estimator_problems(runs: list[PlannedRun], sections: list[Any], where: str, host: PluginHost) -> list[str]:
    """Estimator stages and parameters of each distinct estimator setting, every error at
    the place that gave the culprit (the base, a variation, an override)."""
    problems, seen, reported = [], set(), set()
    for run, section in zip(runs, sections):
        key = repr({name: section.get(name) for name in ("name", "params", "stages")} if isinstance(section, dict)
                   else section)
        if key in seen:
            continue
        seen.add(key)
        for at, message in estimator_problems(section, where, host, EstimatorConfig.name):
            if (at, message) not in reported:  # a mistake in the base: once, with the first variation it spoils
                reported.add((at, message))
                problems.append(f"{at}: variation {run.variation!r}: {message}")
    return problems


def _rollout_field_problems(runs: list[PlannedRun], where: str, host: PluginHost) -> list[str]:
    """Each variation whose rollout cannot give its estimator the fields it reads
    (``rollout_field_problem``), once per distinct estimator, backend and plugins."""
    problems, seen = [], set()
    for run in runs:
        config = run.config
        key = repr((config.estimator, config.rollout.backend, config.plugins))
        if key in seen:
            continue
        seen.add(key)
        problem = rollout_field_problem(config, host)
        if problem:
            problems.append(f"{where}: variation {run.variation!r}: {problem}")
    return problems


def _known_metrics(names: Any) -> str | None:
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        return f"unknown metric {unknown[0]!r}.{suggest(str(unknown[0]), METRICS)} Metrics: {', '.join(METRICS)}"
    return None


def _compare_to_problems(target: str | None, runs: list[PlannedRun], data: CommentedMap, where: str) -> list[str]:
    """Why ``compare_to`` names neither a variation nor a ``name=value`` setting of one."""
    if target is None:
        return []
    names = list(dict.fromkeys(run.variation for run in runs))
    settings = list(dict.fromkeys(f"{_short(key)}={value}" for run in runs for key, value in run.settings.items()))
    if target in names or target in settings:
        return []
    return [f"{key_location(data, 'compare_to', where)}: compare_to: {target!r} is neither a variation nor a setting "
            f"of one.{suggest(target, list(dict.fromkeys(names + settings)))} Variations: {', '.join(names)}; settings: "
            f"{', '.join(settings) or '(none)'}"]


def _judge_validators() -> dict:
    """Checks of the ``evaluation.judges`` keys that take names."""
    from leaf_plugins.evaluation.judge_model import DTYPES

    def choice(allowed: tuple[str, ...]):
        def check(value: Any) -> str | None:
            if value in allowed:
                return None
            return f"unknown value {value!r}.{suggest(str(value), allowed)} One of: {', '.join(allowed)}"
        return check

    out = {}
    for name in ("da", "likert"):
        out[f"evaluation.judges.{name}.task"] = choice(("auto", "qa", "translation"))
        out[f"evaluation.judges.{name}.dtype"] = choice(("auto", *DTYPES))
    return out


def _warm_start(data: CommentedMap, where: str, host: PluginHost) -> tuple[WarmStartConfig | None, list[str]]:
    """The warm start the study names (a YAML path, or a mapping in the study file)."""
    raw = data.get("warm_start")
    if raw is None:
        return None, []
    location = key_location(data, "warm_start", where)
    if isinstance(raw, str):
        try:
            node, file = load_yaml(Path(raw)), raw
        except ConfigError as error:
            return None, [f"{location}: warm_start: {error}"]
    elif isinstance(raw, CommentedMap):
        node, file = raw, where
    else:
        return None, [f"{location}: warm_start: expected a path or a mapping, got {raw!r}"]
    return build_collecting(WarmStartConfig, node, file, warm_start_validators(host),
                            prefix="" if isinstance(raw, str) else "warm_start.")


def _variations(data: CommentedMap, where: str) -> tuple[list[tuple[str, dict, dict]], list[str]]:
    """``(label, {key: value}, {key: (value, location)})`` of every variation: the list
    entries times the grid's cross product (one empty variation when there are none)."""
    errors: list[str] = []
    listed: list[tuple[str | None, dict]] = []
    entries = data.get("variations") or []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, CommentedMap) or not entry:
            errors.append(f"{_item_where(entries, index, where)}: variations[{index}]: expected a mapping of "
                          f"key.path: value, got {entry!r}")
            continue
        settings = {}
        for key in entry:
            if key == LABEL:
                continue
            problem = _key_problem(str(key))
            location = key_location(entry, key, where)
            if problem:
                errors.append(f"{location}: variations[{index}]: {problem}")
            else:
                settings[str(key)] = (entry[key], location)
        label = entry.get(LABEL)
        listed.append((str(label) if label is not None else None, settings))
    grid = data.get("grid") or CommentedMap()
    axes: list[list[tuple[str, Any, str]]] = []
    for key in grid if isinstance(grid, dict) else []:  # a file's mapping, or one given whole on the command line
        location = key_location(grid, key, where)
        problem = _key_problem(str(key))
        values = grid[key]
        if problem:
            errors.append(f"{location}: grid: {problem}")
        elif not isinstance(values, list) or not values:
            errors.append(f"{location}: grid: {key}: expected a non-empty list of values, got {values!r}")
        else:
            axes.append([(str(key), value, _item_where(values, i, where)) for i, value in enumerate(values)])
    out = []
    for (label, settings), combination in itertools.product(listed or [(None, {})], itertools.product(*axes)):
        located = dict(settings)
        located.update({key: (value, location) for key, value, location in combination})
        plain = {key: value for key, (value, _) in located.items()}
        shown = ", ".join(f"{_short(key)}={value}" for key, value, _ in combination)
        name = ", ".join(part for part in (label, shown) if part) or (
            ", ".join(f"{_short(key)}={value}" for key, value in plain.items()) or "base")
        out.append((name, plain, located))
    labels = [name for name, _, _ in out]
    for name in dict.fromkeys(labels):
        if labels.count(name) > 1 or (slug(name) != name and [slug(n) for n in labels].count(slug(name)) > 1):
            at = _key_where(data, "variations" if "variations" in data else "grid", where)
            errors.append(f"{at}: two variations are both named {name!r}: give them different labels")
    return out, errors


def _short(key: str) -> str:
    """The name of a varied key in a label: its last part (``estimator`` for
    ``estimator.name``)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def _key_problem(key: str) -> str | None:
    """Why ``key`` (dotted) is not a run-config key, with a did-you-mean."""
    if plugin_setting(key):
        return None  # plugins.NAME.PARAM: checked against plugin NAME's parameters, once the run names it
    cls: Any = TrainConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            path = ".".join(parts[:depth])
            return (f"unknown key {key!r}.{suggest(part, fields)} Valid keys"
                    f"{' of ' + repr(path) if path else ''}: {', '.join(fields)}")
        hint = typing.get_type_hints(cls)[part]
        if not dataclasses.is_dataclass(hint):
            if depth < len(parts) - 1 and typing.get_origin(hint) is not dict:
                return f"{'.'.join(parts[: depth + 1])!r} is a value, not a section"
            return None  # free-form sections (estimator.params, task.options) take any key
        cls = hint
    return f"{key!r} is a section; vary one of its keys"


def _key_where(node: Any, key: str, where: str) -> str:
    """``file:line:col`` of ``key`` in the mapping ``node``; the file's start (or the
    location ``where`` already is) when the key is absent."""
    if isinstance(node, CommentedMap) and key in node:
        return key_location(node, key, where)
    return where if re.search(r":\d+:\d+$", where) else f"{where}:1:1"


def _item_where(sequence: Any, index: int, where: str) -> str:
    try:
        line, column = sequence.lc.item(index)
        return f"{where}:{line + 1}:{column + 1}"
    except (AttributeError, KeyError, TypeError, IndexError):
        return _key_where(None, "", where)
