"""The run configuration; defaults are the paper's Table 7."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from leaf_plugins.core.config import (build_collecting, format_errors, key_location, load_yaml, parse_overrides,
                                      resolve_includes)
from leaf_plugins.core.errors import ConfigError, LeafError, suggest
from leaf_plugins.core.parameters import configured, located_parameter_problems
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.training.aggregation import LOSS_AGGREGATIONS
from leaf_plugins.training.checkpoint import keep_checkpoints_problem
from leaf_plugins.training.estimator_switch import announce_dropped, apply_layer, estimator_problems
from leaf_plugins.training.finite import NONFINITE_REWARD_POLICIES
from leaf_plugins.training.importance_correction import CORRECTION_LEVELS, ROLLOUT_CORRECTIONS
from leaf_plugins.training.loss import IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, KL_PLACES, OLD_LOGPROB_SOURCES
from leaf_plugins.training.optimization import LR_SCHEDULES
from leaf_plugins.training.overlong import OVERLONG_POLICIES
from leaf_plugins.training.ranges import RUN_RANGES
from leaf_plugins.training.rewards import reward_validator
from leaf_plugins.rollout.assembly import SURPRISAL_SOURCES
from leaf_plugins.training.sharding import SHARDING_MODES
from leaf_plugins.training.trackers import TRACKERS
from leaf_plugins.training.stage_plugins import (apply_plugin_settings, plugin_parameter_problems, plugin_setting,
                                                 plugins_validator, resolve_plugins)

__all__ = [
    "BackboneConfig", "TaskConfig", "EstimatorConfig", "RolloutConfig", "OptimConfig", "LoraSettings", "TrainConfig",
    "load_train_config", "registered", "train_validators", "task_examples", "named_parameter_problems",
    "rollout_field_problem",
]


@dataclass
class BackboneConfig:
    name: str = "tiny-qwen2-audio"
    path: str | None = None  # hub id or local directory; default: the backbone's own
    dtype: str | None = None
    seed: int = 0  # weights of the built-in tiny backbones


@dataclass
class TaskConfig:
    name: str = "spoken-translation"
    split: str = "train"
    options: dict[str, Any] = field(default_factory=dict)  # the task's parameters (local paths, sizes…), validated
    # against its `parameters` dataclass


@dataclass
class EstimatorConfig:
    name: str = "leaf"
    params: dict[str, Any] = field(default_factory=dict)  # e.g. {fork_budget: 2}
    stages: dict[str, str] = field(default_factory=dict)  # e.g. {select_boundaries: collision}


@dataclass
class RolloutConfig:
    group_size: int = 8  # K
    prompts_per_step: int = 6  # rollout batch = training batch
    max_new_tokens: int = 200
    max_prompt_tokens: int = 256  # text tokens of a prompt (audio slots not counted)
    temperature: float = 1.0
    top_p: float = 0.9
    surprisal_from: str = "sampling"
    backend: str | None = None  # a registered rollout backend: static (our decode loop), generate (Hugging Face),
    # or a package's (`leaf plugins --kind rollout_backend`); unset: static where supported
    backend_params: dict[str, Any] = field(default_factory=dict)  # the parameters of rollout.backend (one that
    # declares a `parameters` dataclass; needs rollout.backend set)
    dynamic_sampling: bool = False  # DAPO's: groups whose rewards are all equal are dropped and more prompts are
    # sampled until the step has prompts_per_step informative groups, or max_sampling_rounds rounds ran
    max_sampling_rounds: int = 3  # rounds of prompts_per_step prompts a step may sample with dynamic_sampling
    overlong: str = "keep"  # responses cut at max_new_tokens: keep (the paper's), mask (they leave the loss) or
    # penalty (DAPO's soft length penalty over the last overlong_buffer tokens, added to the reward)
    overlong_buffer: int | None = None  # tokens before max_new_tokens where the penalty ramps up; unset: a fifth
    overlong_penalty_factor: float = 1.0  # the penalty at max_new_tokens


@dataclass
class OptimConfig:
    learning_rate: float = 5e-6  # AdamW's learning rate, the peak after any warmup (the paper's 5e-6)
    micro_batch_prompts: int = 1  # prompts (each with its K responses) per forward/backward
    clip_epsilon: float = 0.2  # ε of Eq. 1: the ratio is clipped to [1 - ε, 1 + ε] (0.2, as in GRPO and PPO)
    kl_coefficient: float = 0.02  # β of Eq. 1 on KL(π_θ || π_ref) (the paper's 0.02); 0: no KL term, no reference pass
    loss_aggregation: str = "token_mean"  # token_mean (paper Eq. 1), sequence_mean (GRPO), sequence_sum, constant
    # (Dr. GRPO); or verl's names: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm
    activation_checkpointing: bool = False  # recompute the language model's activations in the backward pass
    old_logprobs: str = "rollout"  # π_old: the rollout's log π, or teacher_forced (the policy's log π before the
    # step's first update, from a teacher-forced pass)
    updates_per_rollout: int = 1  # μ: passes over the step's rollout, π_old fixed; from the second on the ratio
    # moves off 1 and the clip acts (TRL num_iterations, verl ppo_epochs). 1: the paper's one update per rollout
    mini_batches: int = 1  # optimizer steps per pass, each on a share of the step's prompts (positions ≡ m mod
    # mini_batches; verl ppo_mini_batch_size = prompts_per_step / mini_batches). 1: the paper's whole-step update
    max_grad_norm: float | None = None  # clip the global gradient norm of each optimizer step to this; unset: no
    # clipping, the paper's plain Adam step (TRL and verl clip at 1.0 by default)
    lr_schedule: str = "constant"  # the learning rate over the run's steps after the warmup: constant (the
    # paper's), linear or cosine decay towards 0 at step steps+1 (docs/training.md)
    warmup_steps: int = 0  # steps of a linear warmup from 0 before the schedule (0: the paper's, none)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay on the adapter (0: Adam, the paper's optimizer)
    clip_epsilon_high: float | None = None  # DAPO's clip-higher: the ratio is clipped to [1 - ε, 1 + ε_high];
    # unset: clip_epsilon (a symmetric clip, the paper's)
    dual_clip: float | None = None  # c > 1 of dual-clip PPO: a token with a negative advantage loses at most c·|A|;
    # unset: none
    importance_sampling_level: str = "token"  # token (a ratio per token, the paper's) or sequence (GSPO's
    # length-normalised ratio of the whole response)
    kl_estimator: str = "k3"  # the estimator of KL(π_θ || π_ref): k1, k2 or k3 (the paper's)
    kl_in: str = "loss"  # the KL term in the loss (the paper's) or subtracted from the rewards (summed over each
    # response's tokens, before the estimator)
    entropy_coefficient: float = 0.0  # an entropy bonus: the loss minus this times the policy's mean entropy
    rollout_correction: str = "none"  # none, tis (truncated importance weights) or mis (masked): corrects for
    # the rollout engine's log π differing from the trainer's (training/importance_correction.py)
    rollout_correction_level: str = "token"  # token or sequence (the product over each response's tokens)
    rollout_correction_cap: float = 2.0  # C: tis truncates the weights at C, mis masks the tokens above it


@dataclass
class LoraSettings:
    rank: int = 64
    alpha: int = 128
    dropout: float = 0.05


@dataclass
class TrainConfig:
    """One training run."""

    output_dir: str = "runs/default"
    seed: int = 0
    steps: int = 100
    checkpoint_every: int = 10
    keep_checkpoints: int | str = 1  # the newest N checkpoints are kept (older ones deleted), or all
    sharding: str = "none"  # none (each process holds the model; DDP), or fsdp2: sharded over the processes
    log_rollouts: bool = False  # every step's rollout groups to rollouts.jsonl (forkability analysis)
    nonfinite_rewards: str = "error"  # a NaN/inf reward stops the run, or drop_group: its group is left out
    threads: int | None = None  # torch's CPU threads; unset: chosen from the model and usable cores (training/threads.py)
    reward: str | list[dict[str, Any]] = "sentence_bleu"  # a registered reward, or several weighted ones:
    # [{name: sentence_bleu, weight: 1.0}, {name: exact_match, weight: 0.5, params: {...}}]; the step's reward is
    # the weighted sum, each logged as reward/NAME
    reward_params: dict[str, Any] = field(default_factory=dict)  # the parameters of `reward` (one that declares a
    # `parameters` dataclass; a list gives each reward its own params)
    report_to: list[str] = field(default_factory=list)  # trackers besides metrics.jsonl: tensorboard, wandb,
    # mlflow, trackio (accelerate's; each its package installed: pip install 'leaf-plugins[trackers]')
    plugins: list[str | dict[str, Any]] = field(default_factory=list)  # plugins whose run-time hooks (rollout,
    # score_rollouts, compute_loss, on_step_end, on_estimate, the lifecycle hooks) this run uses: leaf_plugins
    # entry-point names or module paths, each a name or {name: NAME, params: {...}}
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)


def task_examples(task: TaskConfig, split: str | None = None, host: PluginHost | None = None) -> list:
    """The examples of ``split`` (default: ``task.split``) of the configured task: the task
    built with its parameters (``task.options``; a task that declares none takes none),
    then ``load(split)``."""
    plugin = (host or get_host()).tasks.get(task.name)
    return list(configured("task", task.name, plugin, task.options).load(split or task.split))


def load_train_config(path: Path, overrides: Iterable[str] = (), host: PluginHost | None = None) -> TrainConfig:
    """A ``TrainConfig`` from a YAML file and ``a.b=value`` overrides; registered names
    (backbone, task, estimator, reward) are checked against the plugin registries, numbers
    against their ranges, and the estimator's parameters against its own parameter
    dataclass; every error is reported at once, each named where it was given
    (``file:line:col`` or the override).

    An override of ``estimator.name`` switches the estimator: the file's parameters it
    does not read are left out, named in one ``ConfigNotice`` warning
    (``training/estimator_switch.py``)."""
    host = host or get_host()
    where = str(path)
    data = load_yaml(path)
    resolve_includes(data, Path(path))  # a recipe of configs/recipes/, say
    settings, errors = parse_overrides(overrides)
    plugin_settings = [setting for setting in settings if plugin_setting(setting[0])]
    found, dropped = apply_layer(data, [setting for setting in settings if setting not in plugin_settings], where, host)
    found += apply_plugin_settings(data, plugin_settings)
    config, built = build_collecting(TrainConfig, data, where, train_validators(host))
    errors += found + built
    errors += [f"{at}: {message}"
               for at, message in estimator_problems(data.get("estimator"), where, host, EstimatorConfig.name)]
    errors += [f"{at}: {message}" for at, message in named_parameter_problems(data, where, host)]
    if not errors:
        errors += _mini_batch_problems(config, data, where)
    if not errors:
        problem = rollout_field_problem(config, host)
        if problem:
            rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
            at = (key_location(rollout, "backend", where) if "backend" in rollout
                  else key_location(data["estimator"], "name", where) if isinstance(data.get("estimator"), dict)
                  and "name" in data["estimator"] else where)
            errors.append(f"{at}: {problem}")
    if errors:
        raise ConfigError(format_errors(where, errors))
    announce_dropped([dropped] if dropped else [])
    return config


def rollout_field_problem(config: TrainConfig, host: PluginHost) -> str | None:
    """Why the run's rollout cannot give its estimator the per-token fields its stages
    read (``Engine.requires``), or None when it can: the rollout backend's
    ``produces`` (the built-ins': Σπ²), or, where a plugin the run names implements
    ``rollout``, that plugin's, must hold every field the estimator requires beyond
    surprisal and log-probs."""
    from leaf_plugins.core.engine import Engine
    from leaf_plugins.rollout.backends import ROLLOUT_BACKENDS, produced_fields

    engine = Engine(config.estimator.name, config.estimator.params, config.estimator.stages, host=host)
    sampling = [plugin for plugin in resolve_plugins(config.plugins, host) if "rollout" in plugin.hooks]
    if sampling:
        producer, produced = f"plugin {sampling[0].name!r} (its rollout hook)", produced_fields(sampling[0].plugin)
    elif config.rollout.backend is not None:
        producer = f"rollout backend {config.rollout.backend!r}"
        produced = produced_fields(host.rollout_backends.get(config.rollout.backend))
    else:  # chosen for the model when it loads: one of the built-ins, which produce the same fields
        producer = f"the built-in rollout backends ({', '.join(ROLLOUT_BACKENDS)})"
        produced = produced_fields(host.rollout_backends.get(ROLLOUT_BACKENDS[0]))
    missing = [name for name in engine.requires if name not in produced]
    if not missing:
        return None
    source, stage = engine.required_by.get(missing[0], (config.estimator.name, "stages"))
    fields = " and ".join(repr(name) for name in missing)
    return (f"estimator {source!r} requires the per-token field{'s' if len(missing) > 1 else ''} {fields} (its "
            f"{stage} reads {'them' if len(missing) > 1 else 'it'}), which {producer} does not produce (it produces "
            f"{', '.join(produced)}): choose a rollout backend that computes {'them' if len(missing) > 1 else 'it'} "
            f"(rollout.backend; `leaf plugins --kind rollout_backend` lists them) or another estimator")


def named_parameter_problems(data: Any, where: str, host: PluginHost, prefix: str = "") -> list[tuple[str, str]]:
    """``(location, message)`` of every problem of the parameters a run config (``data``,
    read from ``where``) gives the objects it names, other than the estimator: each
    ``plugins`` entry's ``params``, ``reward_params``, ``rollout.backend_params``, and
    ``task.options``. Each is checked against the named object's ``parameters``
    dataclass as an estimator's are (a task that declares none takes none); a name that
    is not registered is left to the config's own checks.

    :param prefix: the dotted path of the run config in its file (``base.`` in a study),
        before each message's key."""
    if not isinstance(data, dict):
        return []

    def here(node: Any, key: str) -> str:
        return key_location(node, key, where) if isinstance(node, dict) and key in node else where

    problems = [(at, prefix + message) for at, message in
                plugin_parameter_problems(data.get("plugins"), where, here(data, "plugins"), host)]
    reward = data.get("reward", TrainConfig.reward)
    if isinstance(reward, str) and reward in host.rewards:
        problems += [(at, prefix + message) for at, message in located_parameter_problems(
            "reward", reward, host.rewards.get(reward), data.get("reward_params"), "reward_params", where,
            here(data, "reward_params"))]
    elif isinstance(reward, list):
        if data.get("reward_params"):
            problems.append((here(data, "reward_params"), f"{prefix}reward_params: the parameters of a list of "
                                                          f"rewards go in each entry's params"))
        for entry in reward:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name in host.rewards and isinstance(entry.get("params", {}), dict):
                problems += [(at, prefix + message) for at, message in located_parameter_problems(
                    "reward", name, host.rewards.get(name), entry.get("params"), f"reward[{name}].params", where,
                    here(entry, "params") if "params" in entry else here(data, "reward"))]
    rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    backend, backend_params = rollout.get("backend"), rollout.get("backend_params")
    if backend is None and backend_params:
        problems.append((here(rollout, "backend_params"), f"{prefix}rollout.backend_params: name the backend they are "
                                                          f"for in rollout.backend"))
    elif isinstance(backend, str) and backend in host.rollout_backends:
        problems += [(at, prefix + message) for at, message in located_parameter_problems(
            "rollout backend", backend, host.rollout_backends.get(backend), backend_params, "rollout.backend_params",
            where, here(rollout, "backend_params"))]
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    name = task.get("name", TaskConfig.name)
    if isinstance(name, str) and name in host.tasks:
        problems += [(at, prefix + message) for at, message in located_parameter_problems(
            "task", name, host.tasks.get(name), task.get("options"), "task.options", where, here(task, "options"))]
    return problems


def _mini_batch_problems(config: TrainConfig, data: Any, where: str) -> list[str]:
    """``optim.mini_batches`` larger than ``rollout.prompts_per_step`` (some mini-batch
    would hold no prompt), named where it was given."""
    mini_batches, prompts = config.optim.mini_batches, config.rollout.prompts_per_step
    if mini_batches <= prompts:
        return []
    optim = data.get("optim")
    at = key_location(optim, "mini_batches", where) if optim is not None and "mini_batches" in optim else where
    return [f"{at}: optim.mini_batches: {mini_batches} mini-batches of rollout.prompts_per_step={prompts} prompts "
            f"would leave some empty: at most {prompts}"]


def train_validators(host: PluginHost, prefix: str = "") -> dict[str, Callable[[Any], str | None]]:
    """The checks of a run config's registered names and choices, keyed by dotted path
    (under ``prefix`` when the run config is a section of another file)."""
    checks: dict[str, Callable[[Any], str | None]] = {
        "backbone.name": registered(host.backbones),
        "task.name": registered(host.tasks),
        "estimator.name": registered(host.estimators),
        "reward": reward_validator(host),
        "report_to": one_of(TRACKERS, many=True),
        "optim.importance_sampling_level": one_of(IMPORTANCE_SAMPLING_LEVELS),
        "optim.kl_estimator": one_of(KL_ESTIMATORS),
        "optim.kl_in": one_of(KL_PLACES),
        "optim.rollout_correction": one_of(ROLLOUT_CORRECTIONS),
        "optim.rollout_correction_level": one_of(CORRECTION_LEVELS),
        "rollout.overlong": one_of(OVERLONG_POLICIES),
        "threads": lambda value: None if value is None or (isinstance(value, int) and not isinstance(value, bool)
                                                            and 1 <= value <= 1024)
        else f"must be an integer in [1, 1024] (or unset: chosen from the model and the usable cores), got {value!r}",
        "keep_checkpoints": keep_checkpoints_problem,
        "sharding": lambda value: None if value in SHARDING_MODES else f"must be one of {', '.join(SHARDING_MODES)}",
        "nonfinite_rewards": lambda value: None if value in NONFINITE_REWARD_POLICIES
        else f"must be one of {', '.join(NONFINITE_REWARD_POLICIES)}",
        "rollout.surprisal_from": lambda value: None if value in SURPRISAL_SOURCES
        else f"must be one of {', '.join(SURPRISAL_SOURCES)}",
        "rollout.backend": lambda value: None if value is None else registered(host.rollout_backends)(value),
        "plugins": plugins_validator(host),
        "optim.loss_aggregation": lambda value: None if value in LOSS_AGGREGATIONS
        else f"must be one of {', '.join(LOSS_AGGREGATIONS)}",
        "optim.old_logprobs": lambda value: None if value in OLD_LOGPROB_SOURCES
        else f"must be one of {', '.join(OLD_LOGPROB_SOURCES)}",
        "optim.lr_schedule": lambda value: None if value in LR_SCHEDULES
        else f"must be one of {', '.join(LR_SCHEDULES)}",
    }
    return {prefix + key: check for key, check in {**RUN_RANGES, **checks}.items()}


def one_of(choices: Sequence[str], many: bool = False) -> Callable[[Any], str | None]:
    """A validator: the value is one of ``choices`` (with ``many``, a list of them, each
    once), a misspelling answered with a did-you-mean."""

    def check(value: Any) -> str | None:
        values = value if many and isinstance(value, list) else None if many else [value]
        if values is None:
            return f"must be a list of {', '.join(choices)}, got {value!r}"
        for item in values:
            if item not in choices:
                return f"must be {'a list of' if many else 'one of'} {', '.join(choices)}, got {item!r}." \
                       f"{suggest(str(item), choices)}".removesuffix(".")
        repeated = sorted({item for item in values if values.count(item) > 1})
        return f"names {repeated[0]!r} twice" if repeated else None

    return check


def registered(registry: Any) -> Callable[[Any], str | None]:
    """A validator: the name must be registered (its message has the did-you-mean)."""

    def check(name: Any) -> str | None:
        try:
            registry.get(name)
        except LeafError as error:
            return str(error)
        return None

    return check
