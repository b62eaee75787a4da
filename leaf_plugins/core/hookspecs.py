"""The plugin reference: every hook a leaf-plugins plugin can implement.

Two kinds of hooks live here.

*Discovery hooks* (``register_*``) are called once, on the global plugin manager that
loads the built-ins and every package in the ``leaf_plugins`` entry-point group. They
collect through a ``register`` callback, so the host owns the registries and can
reject duplicate names.

*Run-time hooks* are called on a fresh per-run plugin manager that holds exactly one
estimator (plus the observers and the trainer's default stages). The stage hooks are
``firstresult``: they stop at the first non-None result, so which other plugins are
installed never changes a result. ``on_*`` observer hooks return nothing and are called
on every plugin that implements them.

A plugin is a module or an object whose methods are decorated with
``leaf_plugins.hookimpl`` and named exactly as below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    import torch

    from leaf_plugins.core.batch import RolloutBatch
    from leaf_plugins.core.stages import PolicyLoss, Rollout, StepContext
    from leaf_plugins.core.tree import Boundaries, EstimateResult, Nodes

__all__ = ["PROJECT", "hookspec", "hookimpl", "LeafSpecs"]

PROJECT = "leaf_plugins"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class LeafSpecs:
    """Hook specifications of leaf-plugins."""

    # ------------------------------------------------------------------ discovery
    @hookspec
    def register_estimators(self, register: Callable[[str, Any], None]) -> None:
        """Register advantage estimators.

        :param register: call ``register(name, estimator)`` once per estimator. The
            estimator is an object whose ``hookimpl`` methods implement some of the stage
            hooks ``select_boundaries``, ``retain_nodes`` and ``compute_advantages``, and
            whose docstring's first line describes it in ``leaf plugins``.

        The estimator declares its parameters as ``parameters = SomeParams``: a
        (preferably frozen) ``@dataclass`` class whose fields are the parameters, each
        with a type hint, a default and its help in ``field(default=...,
        metadata={"help": "..."})``; ``leaf_plugins.NoParameters`` when it has none.
        leaf-plugins checks every value given (``Engine(name, params={...})``,
        ``estimator.params.X`` in a run config, an override, a study grid) against the
        type hints (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, unions and
        ``Optional`` of these), refuses a name the dataclass does not declare with a
        did-you-mean, then builds the dataclass; its ``__post_init__`` may check more
        and raise ``ValueError`` with a message naming the parameter. An estimator
        without ``parameters`` (or with an empty set) works, with a
        ``DeprecationWarning``; a set of names is refused.
        """

    @hookspec
    def register_backbones(self, register: Callable[[str, Any], None]) -> None:
        """Register speech-LLM backbones.

        :param register: call ``register(name, backbone)`` once per backbone, where
            ``backbone`` follows ``leaf_plugins.backbones.base.Backbone``.
        """

    @hookspec
    def register_tasks(self, register: Callable[[str, Any], None]) -> None:
        """Register speech tasks (datasets with prompts, references and a reward).

        :param register: call ``register(name, task)`` once per task, where ``task``
            follows ``leaf_plugins.tasks.base.Task``.
        """

    @hookspec
    def register_rewards(self, register: Callable[[str, Any], None]) -> None:
        """Register reward functions.

        :param register: call ``register(name, reward)`` once per reward, where
            ``reward(predictions: list[str], references: list[str]) -> list[float]``
            scores each prediction against its reference.
        """

    # ------------------------------------------------------------------ estimator stages
    @hookspec(firstresult=True)
    def select_boundaries(self, batch: RolloutBatch, params: Any) -> Boundaries | None:
        """Choose, for every group, the token boundaries at which prefixes are compared.

        :param batch: the padded rollout batch (tokens ``[N, T]``, surprisal ``[N, T]``…).
        :param params: the validated parameters: an instance of the ``parameters``
            dataclass of the estimator that implements this stage. A stage borrowed
            through ``estimator.stages`` gets an instance of the *borrowed* estimator's
            dataclass, filled from the same parameters (the names it declares); two
            involved estimators that declare one name with different types or defaults
            cannot be combined (``ConfigError``).
        :return: ``Boundaries`` with ``positions [G, B]`` sorted ascending per group,
            ``-1`` where a group has fewer than ``B`` boundaries.

        Stops at first non-None result.
        """

    @hookspec(firstresult=True)
    def retain_nodes(self, batch: RolloutBatch, boundaries: Boundaries, params: Any) -> Nodes | None:
        """Group responses by exact shared prefixes and keep the groups that become nodes.

        :param batch: the padded rollout batch.
        :param boundaries: the output of ``select_boundaries``.
        :param params: an instance of the implementing estimator's ``parameters``
            dataclass (see ``select_boundaries``).
        :return: ``Nodes``: one row per retained node (group, position, value, size)
            and, per response, the path of nodes it passes through ordered by position.

        Stops at first non-None result.
        """

    @hookspec(firstresult=True)
    def compute_advantages(self, batch: RolloutBatch, nodes: Nodes, params: Any) -> torch.Tensor | None:
        """Turn the retained nodes into per-token advantages.

        :param batch: the padded rollout batch.
        :param nodes: the output of ``retain_nodes``.
        :param params: an instance of the implementing estimator's ``parameters``
            dataclass (see ``select_boundaries``).
        :return: float32 ``[N, T]`` advantages, exactly 0 on padding.

        Stops at first non-None result.
        """

    # ------------------------------------------------------------------ observers
    @hookspec
    def on_estimate(self, batch: RolloutBatch, result: EstimateResult) -> None:
        """Called after every estimate with the batch and the full result (boundaries,
        nodes, advantages). For logging and analysis; must not modify either."""

    # ------------------------------------------------------------------ training stages
    @hookspec(firstresult=True)
    def rollout(self, context: StepContext) -> Rollout | None:
        """Sample K responses for each prompt of the step (the built-in one runs the
        backend ``rollout.backend`` names: the static decode loop or ``generate``).

        :param context: the step: model, backbone, model inputs of the prompts (with
            their ``inputs_embeds``), the examples, the run configuration.
        :return: a ``Rollout`` (``core/stages.py``): a batch of K consecutive rows per
            prompt with tokens (EOS included, then -1), log π_old under logits /
            temperature without top-p, surprisal, Σπ², the logits' width; the prompt
            index; the texts. docs/training.md, "A third-party backend", lists it all.

        Stops at first non-None result.
        """

    @hookspec(firstresult=True)
    def score_rollouts(self, context: StepContext, rollout: Rollout) -> torch.Tensor | None:
        """Score every response.

        :param context: the step (its examples hold the references).
        :param rollout: the sampled responses.
        :return: float32 ``[N]`` rewards.

        Stops at first non-None result.
        """

    @hookspec(firstresult=True)
    def compute_loss(
        self,
        context: StepContext,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        reference_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        weights: torch.Tensor,
    ) -> PolicyLoss | None:
        """The loss of one micro-batch (all ``[M, T]``: log π_θ (differentiable), log π_old
        (the rollout's, or the detached log π_θ with ``optim.old_logprobs: teacher_forced``),
        log π_ref, advantages, the bool mask of response tokens, and each token's weight
        in the step's loss, normalised over the whole step as ``optim.loss_aggregation``
        says: a micro-batch's loss is its share, and the step's gradient is their sum).

        :return: a ``PolicyLoss`` whose ``loss`` is back-propagated.

        Stops at first non-None result.
        """

    @hookspec
    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        """Called after every optimizer step with the step's metrics (reward, loss, KL,
        clip fraction, advantage statistics, timings). For logging; must not modify them."""
