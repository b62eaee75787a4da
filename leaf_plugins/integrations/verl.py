"""Every registered leaf-plugins estimator as a verl advantage estimator.

Importing this module (verl does it on ``import verl`` through the ``verl.plugins`` entry
point this package declares) registers each leaf-plugins estimator in verl's
``ADV_ESTIMATOR_REGISTRY`` under its own name, except names verl already has (``grpo``,
``rloo``, ...: verl's own stay), and wraps verl's ``compute_advantage`` so that these
estimators also receive what tree credit needs and verl's registry call omits: the
response tokens (``responses``), the old log-probs (``old_log_probs``, surprisal is their
negative) and ``sum_pi_squared`` where the actor computed it
(``actor_rollout_ref.actor.calculate_sum_pi_squared=true``), each only when the estimator
requires it (``Engine.requires``), with any ``DataProto.batch`` entry named by an
estimator's ``requires`` as an extra per-token field. Estimator parameters come from
``algorithm.leaf_plugins`` (e.g. ``+algorithm.leaf_plugins.fork_budget=2``; a ``stages``
entry holds stage overrides).

It loads only the estimator plugins (``get_estimator_host``): no backbone, task or training
code, so it runs with leaf-plugins' core dependencies beside verl's own. verl 0.9.1's trainer
module imports packages verl does not declare (``pip install 'leaf-plugins[verl]'`` adds
them); without them the estimators are still registered, and the trainer's own import fails.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Mapping

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from leaf_plugins.core.batch import PER_TOKEN_FIELDS
from leaf_plugins.core.engine import Engine
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.plugins import get_estimator_host
from leaf_plugins.integrations.padded import padded_batch

try:
    from verl.trainer.ppo import ray_trainer
except ModuleNotFoundError as missing:  # e.g. cachetools: verl's trainer cannot run here either
    ray_trainer = None
    _TRAINER_MISSING: ModuleNotFoundError | None = missing
else:
    _TRAINER_MISSING = None

__all__ = ["register", "install", "compute_advantage", "leaf_estimators", "PASSED_KEYS"]

PASSED_KEYS = ("responses", "old_log_probs", "sum_pi_squared")
"""``DataProto.batch`` entries the wrapped ``compute_advantage`` passes to leaf estimators."""

_VERL_COMPUTE_ADVANTAGE = getattr(ray_trainer, "compute_advantage", None)


def leaf_estimators() -> dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """The verl estimator functions registered for leaf-plugins, by name."""
    return {name: fn for name, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items() if hasattr(fn, "leaf_estimator")}


def register() -> list[str]:
    """Register every leaf-plugins estimator whose name verl does not already use;
    returns the names now served by leaf-plugins. Idempotent."""
    for name in get_estimator_host().estimators.names():
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(_verl_estimator(name))
    return sorted(leaf_estimators())


def install() -> None:
    """Register the estimators and make verl's trainers call ``compute_advantage`` below
    (verl's modules that imported it by name are rebound too; nothing to rebind when verl's
    trainer cannot be imported). Idempotent."""
    register()
    if _VERL_COMPUTE_ADVANTAGE is None:
        return
    for module in list(sys.modules.values()):
        if vars(module).get("compute_advantage") is _VERL_COMPUTE_ADVANTAGE:  # vars: no lazy-module __getattr__
            module.compute_advantage = compute_advantage  # type: ignore[attr-defined]


def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``compute_advantage``, except that a leaf-plugins estimator also receives
    the ``PASSED_KEYS`` the batch holds. Every other estimator goes to verl's own."""
    name = getattr(adv_estimator, "value", adv_estimator)
    fn = leaf_estimators().get(name)
    if fn is None:
        return _VERL_COMPUTE_ADVANTAGE(data, adv_estimator, *args, **kwargs)
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = ray_trainer.compute_response_mask(data)
    extra = {key: data.batch[key] for key in PASSED_KEYS if key in data.batch.keys()}
    arguments = inspect.signature(_VERL_COMPUTE_ADVANTAGE).bind(data, adv_estimator, *args, **kwargs).arguments
    # the batch's other entries: the estimator keeps those its requires names as extra per-token fields
    extra["extra_fields"] = {key: data.batch[key] for key in data.batch.keys() if key not in PER_TOKEN_FIELDS}
    advantages, returns = fn(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=arguments.get("config"),
        **extra,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


if _VERL_COMPUTE_ADVANTAGE is not None:
    compute_advantage = functools.wraps(_VERL_COMPUTE_ADVANTAGE)(compute_advantage)


@functools.cache
def _verl_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def estimator(
        token_level_rewards: torch.Tensor,  # [N, T] float: the reward sits on each response's last token
        response_mask: torch.Tensor,  # [N, T] int: 1 on the tokens the loss trains
        index: np.ndarray | None = None,  # [N] prompt uid of each response
        config: Any = None,  # verl's algorithm config; its ``leaf_plugins`` entry holds the parameters
        responses: torch.Tensor | None = None,  # [N, T] int: response token ids
        old_log_probs: torch.Tensor | None = None,  # [N, T] float: log pi_old of each response token
        sum_pi_squared: torch.Tensor | None = None,  # [N, T] float: sum_v pi_old(v)^2
        extra_fields: Mapping[str, torch.Tensor] | None = None,  # name -> [N, T]: kept where the estimator requires it
        **unused: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` ``[N, T]`` each (equal, as verl's outcome estimators
        return them), 0 outside ``response_mask``. Of the optional per-token fields only
        those the estimator requires enter its batch."""
        if responses is None or index is None:
            missing = "the response tokens" if responses is None else "the prompt uids"
            raise ConfigError(
                f"leaf-plugins estimator {name!r} needs {missing}, which verl's compute_advantage does not pass "
                "to registered estimators: import leaf_plugins.integrations.verl (done on `import verl` through "
                "the verl.plugins entry point when leaf-plugins is installed) and use verl's legacy trainer "
                "(trainer.use_v1=false), whose compute_advantage it wraps; see docs/integrations.md"
                + _trainer_missing_note()
            )
        engine = _engine(name, _options(config))
        requires = set(engine.requires)
        if sum_pi_squared is None and "sum_pi_squared" in engine.required_by:
            source, stage = engine.required_by["sum_pi_squared"]
            raise ConfigError(f"estimator {source!r} requires sum_pi_squared (its {stage} reads it), which verl's "
                              "actor computes only with actor_rollout_ref.actor.calculate_sum_pi_squared=true")
        groups = torch.as_tensor(np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)[1])
        batch = padded_batch(responses, response_mask, token_level_rewards.sum(dim=-1),
                             groups.reshape(-1).to(responses.device),
                             old_log_probs if requires & {"surprisal", "logprobs"} else None,
                             sum_pi_squared if "sum_pi_squared" in requires else None,
                             extra={key: value for key, value in (extra_fields or {}).items() if key in requires})
        advantages = engine.estimate(batch).advantages.to(token_level_rewards.dtype) * response_mask  # [N, T]
        return advantages, advantages

    estimator.__name__ = f"leaf_plugins_{name}"
    estimator.__qualname__ = estimator.__name__
    estimator.leaf_estimator = name  # type: ignore[attr-defined]
    return estimator


def _trainer_missing_note() -> str:
    if _TRAINER_MISSING is None:
        return ""
    return (f". verl's trainer could not be imported here ({_TRAINER_MISSING}), so nothing is wrapped: "
            "pip install 'leaf-plugins[verl]' adds what it imports")


def _options(config: Any) -> dict[str, Any]:
    """The ``leaf_plugins`` entry of verl's algorithm config as a plain dict."""
    if config is None:
        return {}
    options = config.get("leaf_plugins", None) if hasattr(config, "get") else getattr(config, "leaf_plugins", None)
    if options is None:
        return {}
    if hasattr(options, "items"):
        return {key: dict(value) if isinstance(value, Mapping) or hasattr(value, "items") else value
                for key, value in options.items()}
    raise ConfigError(f"algorithm.leaf_plugins must be a mapping of estimator parameters, got {options!r}")


def _engine(name: str, options: dict[str, Any]) -> Engine:
    params = {key: value for key, value in options.items() if key != "stages"}
    return Engine(name, params, options.get("stages"))


install()
