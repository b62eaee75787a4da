"""``config.yaml`` in a run's directory: the resolved run config, so the directory says
what it trained.

The file holds every key of the run config with defaults filled in, the estimator's
parameters included (those given and the defaults of the rest, of the estimator and of
the estimators its stages are borrowed from). It is a valid run config:
``leaf train RUN_DIR/config.yaml`` trains the same run (resuming it), and
``leaf eval generate RUN_DIR`` samples from it with its backbone.

A run that resumes from a checkpoint must train what the checkpoint's run trained: a
config that differs from the directory's ``config.yaml`` in any key but
``RESUME_FREE_KEYS`` is refused, naming the keys, before the model loads.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from leaf_plugins.core.config import differing_settings
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.parameters import ParameterSchema
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.training.checkpoint import latest_checkpoint
from leaf_plugins.training.durable import replace_text

__all__ = ["RUN_CONFIG", "RESUME_FREE_KEYS", "resolved_config", "write_run_config", "check_resumed_config",
           "run_setting", "check_same_backbone", "run_config_path"]

RUN_CONFIG = "config.yaml"
"""The resolved run config, in the run's directory."""

RESUME_FREE_KEYS = ("steps", "output_dir", "checkpoint_every", "keep_checkpoints", "log_rollouts", "report_to",
                    "threads", "sharding", "optim.micro_batch_prompts", "optim.activation_checkpointing")
"""Keys a resumed run may change: how long it runs, where and how often it writes (and
to which trackers), and how it is computed (torch's thread count, sharding, micro-batches, recomputed
activations), which moves the results by rounding only. Any other difference changes
what the run trains."""


def resolved_config(config: Any, host: PluginHost) -> dict[str, Any]:
    """``config`` (a ``TrainConfig``) as plain YAML-able data, its ``estimator.params``
    filled with the defaults of every parameter the run's estimators declare."""
    data = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    estimator = config.estimator
    schema = ParameterSchema.of(host.estimators, estimator.name, estimator.stages.values())
    params: dict[str, Any] = {}
    for instance in schema.build(dict(estimator.params)).values():  # the main estimator's first
        for field in dataclasses.fields(instance):
            params.setdefault(field.name, getattr(instance, field.name))
    data["estimator"]["params"] = json.loads(json.dumps(params, default=str))
    return data


def write_run_config(output_dir: Path, config: Any, host: PluginHost) -> Path:
    """Write ``output_dir/config.yaml`` (atomically) from ``config``."""
    text = io.StringIO()
    text.write("# The resolved config of this run (every default filled in), written by leaf train.\n"
               "# `leaf train THIS_FILE` trains (resumes) the same run.\n")
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False  # one key a line, as a run config is written by hand
    yaml.dump(resolved_config(config, host), text)
    path = Path(output_dir) / RUN_CONFIG
    replace_text(path, text.getvalue())
    return path


def check_resumed_config(output_dir: Path, config: Any, host: PluginHost) -> None:
    """Refuse to resume the run in ``output_dir`` with a config that trains something
    else: when the directory has a checkpoint and a ``config.yaml``, every key outside
    ``RESUME_FREE_KEYS`` must be equal.

    :raises ConfigError: naming each differing key with the run's value and this one's.
    """
    path = Path(output_dir) / RUN_CONFIG
    if latest_checkpoint(Path(output_dir)) is None or not path.exists():
        return
    held = YAML(typ="safe", pure=True).load(path.read_text()) or {}
    wanted = resolved_config(config, host)
    changed = [f"{key}: {old!r} -> {new!r}" for key, old, new in differing_settings(held, wanted)
               if not any(key == free or key.startswith(free + ".") for free in RESUME_FREE_KEYS)]
    if changed:
        raise ConfigError(f"{output_dir} holds a run trained with other settings ({path}); resuming it with "
                          f"these would train something else: {'; '.join(changed)}. Resume it with its own "
                          f"config (leaf train {path}), or give this run another output_dir")


def run_setting(run_dir: Path, key: str, default: Any = None) -> Any:
    """The value of the dotted ``key`` in ``run_dir/config.yaml``; ``default`` when the
    directory has no such file or the file no such key."""
    path = Path(run_dir) / RUN_CONFIG
    value: Any = YAML(typ="safe", pure=True).load(path.read_text()) if path.exists() else None
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def check_same_backbone(run_dir: Path, config: Any) -> None:
    """Refuse to load the adapter of ``run_dir`` into another backbone than the one it
    was trained on (its ``config.yaml``'s ``backbone.name`` and ``backbone.seed``).

    :raises ConfigError: naming both values.
    """
    for key in ("name", "seed"):
        trained = run_setting(run_dir, f"backbone.{key}")
        given = getattr(config.backbone, key)
        if trained is not None and trained != given:
            raise ConfigError(f"{run_dir} was trained on backbone.{key}={trained!r}, and this config has "
                              f"backbone.{key}={given!r}: give the run's own config ({run_dir / RUN_CONFIG}) or "
                              f"set backbone.{key}={trained}")


def run_config_path(path: Path) -> Path:
    """``path`` itself, or a run directory's ``config.yaml`` when ``path`` is a directory
    that holds one."""
    written = Path(path) / RUN_CONFIG
    return written if Path(path).is_dir() and written.is_file() else Path(path)
