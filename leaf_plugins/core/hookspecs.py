"""The plugin reference: every hook a leaf-plugins plugin can implement.

Two kinds of hooks live here.

*Discovery hooks* (``register_*``) are called once, on the global plugin manager that
loads the built-ins and every package in the ``leaf_plugins`` entry-point group
(``register_commands``: the ``leaf_plugins.commands`` group, which the ``leaf`` console
script loads alone, so that ``leaf --help`` imports no model code). They collect through
a ``register`` callback, so the host owns the registries and can reject duplicate names.

*Run-time hooks* are called on a fresh per-run plugin manager that holds exactly one
estimator (its stages, ``ESTIMATOR_STAGES``, and nothing else), the trainer's default
stages, and the plugins the run config names in ``plugins:`` (an installed plugin is
used only when named): they alone receive the training-stage and lifecycle hooks
(``RUN_HOOKS``). Objects handed to ``Trainer(plugins=[...])`` in code receive the
observer hooks alone (``OBSERVER_HOOKS``). The stage hooks are ``firstresult``: they
stop at the first non-None result; a named plugin's implementation comes before the
built-in stage, and of two named plugins the one named first. ``on_*`` observer hooks
return nothing and are called on every plugin that implements them.

A plugin is a module or an object whose methods are decorated with
``leaf_plugins.hookimpl`` and named exactly as below.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    import torch

    from leaf_plugins.core.batch import RolloutBatch
    from leaf_plugins.core.stages import PolicyLoss, Rollout, StepContext
    from leaf_plugins.core.tree import Boundaries, EstimateResult, Nodes

__all__ = ["PROJECT", "hookspec", "hookimpl", "LeafSpecs", "ESTIMATOR_STAGES", "OBSERVER_HOOKS", "LIFECYCLE_HOOKS",
           "RUN_HOOKS", "hookimpls_of"]

PROJECT = "leaf_plugins"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

ESTIMATOR_STAGES = ("select_boundaries", "retain_nodes", "compute_advantages")
"""The estimator stages, in the order a call runs them; only ``compute_advantages`` is
required (the engine supplies no boundaries and root-only nodes for the others). An
estimator implements these and no other hook."""

OBSERVER_HOOKS = ("on_step_end", "on_estimate")
"""The hooks that observe a run without changing it."""

LIFECYCLE_HOOKS = ("on_run_start", "on_run_end", "on_optimizer_step", "save_plugin_state", "load_plugin_state")
"""The hooks around a run: its start and end, each optimizer step, the plugin's state in
each checkpoint."""

RUN_HOOKS = ("rollout", "score_rollouts", "compute_loss", *OBSERVER_HOOKS, *LIFECYCLE_HOOKS)
"""The hooks a plugin named in a run config's ``plugins:`` may implement."""


def hookimpls_of(plugin: object) -> list[tuple[str, str, dict[str, Any]]]:
    """``(attribute, hook name, options)`` of every ``hookimpl`` of ``plugin`` (the hook
    name is the ``specname`` where one is given), in attribute order."""
    reader = pluggy.PluginManager(PROJECT)
    found = []
    for attribute in dir(plugin):
        try:
            options = reader.parse_hookimpl_opts(plugin, attribute)
        except Exception:  # an attribute that cannot be read is not a hook
            continue
        if options is not None:
            found.append((attribute, options.get("specname") or attribute, dict(options)))
    return found


class LeafSpecs:
    """Hook specifications of leaf-plugins."""

    # ------------------------------------------------------------------ discovery
    @hookspec
    def register_estimators(self, register: Callable[[str, Any], None]) -> None:
        """Register advantage estimators.

        :param register: call ``register(name, estimator)`` once per estimator. The
            estimator is an object whose ``hookimpl`` methods implement
            ``compute_advantages`` and, optionally, ``select_boundaries`` (default: no
            boundaries) and ``retain_nodes`` (default: root-only nodes,
            ``leaf_plugins.core.tree.root_only_nodes``), and whose docstring's first line
            describes it in ``leaf plugins``. An estimator without
            ``compute_advantages``, with a stage attribute that is not a ``hookimpl``, or
            that implements any other run-time hook (a loss, a rollout, a lifecycle or
            observer hook: those belong to a stage plugin named in ``plugins:``), is
            refused here, naming it and its package.

        ``requires`` (optional) names the optional per-token fields of ``RolloutBatch`` it
        reads: a tuple (``("logprobs", "sum_pi_squared")``, for every stage) or a mapping
        stage -> tuple; names are ``surprisal``, ``logprobs``, ``sum_pi_squared`` or the
        name of a ``RolloutBatch.extra`` field. Producers compute what ``Engine.requires``
        lists (every built-in field for an estimator that declares nothing) and the engine
        refuses a batch without a declared field; a run whose rollout backend cannot
        produce a declared field is refused before its model loads.

        The estimator declares its parameters as ``parameters = SomeParams``: a
        (preferably frozen) ``@dataclass`` class whose fields are the parameters, each
        with a type hint, a default and its help in ``field(default=...,
        metadata={"help": "..."})``; ``leaf_plugins.NoParameters`` when it has none.
        leaf-plugins checks every value given (``Engine(name, params={...})``,
        ``estimator.params.X`` in a run config, an override, a study grid) against the
        type hints (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, unions and
        ``Optional`` of these), refuses a name the dataclass does not declare with a
        did-you-mean, then builds the dataclass; its ``__post_init__`` may check more
        and raise ``ValueError`` with a message naming the parameter. Every stage call
        receives the instance as ``params``. An estimator without ``parameters`` takes
        none; anything but a dataclass class is refused.
        """

    @hookspec
    def register_backbones(self, register: Callable[[str, Any], None]) -> None:
        """Register speech-LLM backbones.

        :param register: call ``register(name, backbone)`` once per backbone, where
            ``backbone`` follows ``leaf_plugins.core.backbone.Backbone``.
        """

    @hookspec
    def register_tasks(self, register: Callable[[str, Any], None]) -> None:
        """Register speech tasks (datasets of spoken prompts and their references; the run's
        reward scores the responses against them).

        :param register: call ``register(name, task)`` once per task, where ``task``
            follows ``leaf_plugins.core.task.Task``. A task that takes options (local
            paths, sizes: ``task.options`` in a run config) declares them as its
            parameters, like every plugin (``leaf_plugins.parameterised``); one that
            declares ``parameters`` with no ``with_parameters`` to build them is refused
            here, naming it and its package.
        """

    @hookspec
    def register_rewards(self, register: Callable[[str, Any], None]) -> None:
        """Register reward functions.

        :param register: call ``register(name, reward)`` once per reward, where
            ``reward(predictions: list[str], references: list[str]) -> list[float]``
            scores each prediction against its reference. A reward with parameters
            (``reward_params`` in a run config), a function or a class, declares them
            with ``leaf_plugins.parameterised``; one that declares ``parameters`` with no
            ``with_parameters`` to build them is refused here, naming it and its package.
        """

    @hookspec
    def register_rollout_backends(self, register: Callable[[str, Any], None]) -> None:
        """Register rollout backends: engines that sample the responses of a step
        (``rollout.backend: NAME`` in a run config selects one; ``static`` and
        ``generate`` are the built-ins, registered through this hook).

        :param register: call ``register(name, backend)`` once per backend. ``backend``
            is an object with

            ``sample(request: RolloutRequest) -> Rollout`` (``core/stages.py``)
                ``request`` holds the policy model, the loaded backbone, the prompts'
                inputs (left padded ``[P, L]``, with ``inputs_embeds`` ``[P, L, H]`` when
                the prompts are already embedded), ``group_size`` K, ``max_new_tokens``,
                ``temperature``, ``top_p``, ``surprisal_from``, one group id per prompt
                and, in training, the step's ``StepContext`` (None in evaluation). It
                returns a ``Rollout`` of ``N = P·K`` rows, the K responses of a prompt
                consecutive, prompts in input order: ``batch.tokens [N, T]`` int64 with
                EOS included and -1 after it; ``batch.logprobs [N, T]`` log π_old of each
                sampled token under logits / temperature *without* top-p (what the loss
                ratio needs); ``batch.surprisal [N, T]`` (under the sampling distribution
                after temperature and top-p for ``surprisal_from="sampling"``, else
                ``-logprobs``); ``batch.sum_pi_squared [N, T]`` Σ_v π_old(v)²;
                ``batch.vocab_size`` the logits' width; ``batch.group_ids [N]`` the
                request's ids; rewards 0; ``prompt_index [N]`` int64 the prompt of each
                row; ``texts`` the decoded responses (special tokens skipped). Padding
                positions hold 0 in the float fields. ``request.computes(name)`` says
                whether to compute the optional per-token statistic ``name``.

            ``unsupported_reason(model) -> str | None`` (optional)
                Why the backend cannot sample from ``model`` (a sentence naming what is
                unsupported), or None when it can. Asked before a run starts: a run config
                that names an unsupported backend is refused with this reason. Without
                this method the backend supports every model.

            ``produces`` (optional)
                The optional per-token fields it can compute beyond ``surprisal`` and
                ``logprobs``: ``sum_pi_squared`` and the names of the
                ``RolloutBatch.extra`` fields it adds (it computes those of them that
                ``request.fields`` names). Without it: ``("sum_pi_squared",)``. A run
                whose estimator requires a field its backend does not produce is refused
                before its model loads, naming both.

            ``parameters`` and ``with_parameters`` (optional)
                Its parameters (``rollout.backend_params``), declared as every plugin's
                (``leaf_plugins.parameterised``).

            and a docstring whose first line describes it in ``leaf plugins``. With
            ``rollout.backend`` unset the built-in default applies (``static`` where it
            supports the model, else ``generate``, with a notice); a third-party backend
            runs only when named.
        """

    @hookspec
    def register_commands(self, register: Callable[[str, Any], None]) -> None:
        """Register sub-commands of the ``leaf`` console script (``leaf NAME ...``).

        Implemented by the modules of the ``leaf_plugins.commands`` entry-point group
        (the built-in commands are one), which ``leaf`` loads on its own plugin manager.

        :param register: call ``register(name, command)`` once per command, where
            ``command`` is a ``leaf_plugins.core.command.Command`` or any object with
            ``help`` (one line for ``leaf --help``), ``add_arguments(parser)`` (adds its
            arguments to its ``argparse`` sub-parser), ``run(args) -> int | None`` (the
            exit status; None is 0) and optionally ``epilog`` (text shown below its
            options). ``run`` should raise ``leaf_plugins.LeafError`` for bad input:
            ``leaf`` prints it as one line and exits with status 2. A command that fails
            to import, to register or in ``add_arguments`` is skipped with a warning
            naming it (fatal with ``LEAF_PLUGINS_STRICT=1``); the other commands work.
        """

    # ------------------------------------------------------------------ estimator stages
    @hookspec(firstresult=True)
    def select_boundaries(self, batch: RolloutBatch, params: Any) -> Boundaries | None:
        """Choose, for every group, the token boundaries at which prefixes are compared.
        Optional: an estimator without it gets no boundaries (``Boundaries.empty``).

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
        Optional: an estimator without it gets root-only nodes (no retained node, each
        group's mean reward as ``root_value``).

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
        """Turn the retained nodes into per-token advantages. Every estimator implements it.

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
        """Sample K responses for each prompt of the step (the built-in one asks the
        rollout backend ``rollout.backend`` names: ``static``, ``generate`` or one a
        package registered with ``register_rollout_backends``).

        :param context: the step (``step`` 1-based): model, backbone, model inputs of
            this process's prompts (with their ``inputs_embeds``), the examples, their
            ``group_ids``, the run configuration.
        :return: a ``Rollout`` (``core/stages.py``): a batch of K consecutive rows per
            prompt with tokens (EOS included, then -1), log π_old under logits /
            temperature without top-p, surprisal, Σπ², the logits' width, each prompt's
            group id from ``context.group_ids``; the prompt index; the texts
            (``register_rollout_backends`` describes every field). Under a launch of
            several processes every process returns the same per-token fields.

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
        reference_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        weights: torch.Tensor,
        entropy: torch.Tensor,
        correction: torch.Tensor | None,
    ) -> PolicyLoss | None:
        """The loss of one micro-batch (all ``[M, T]``: log π_θ (differentiable), log π_old
        (the rollout's, or the trainer's teacher-forced log π at the step's start with
        ``optim.old_logprobs: teacher_forced`` or a rollout correction), log π_ref (None
        where no reference pass ran: ``optim.kl_coefficient`` 0), advantages, the bool
        mask of response tokens, each token's weight in the step's loss, normalised over
        the whole step as ``optim.loss_aggregation`` says (a micro-batch's loss is its
        share, and the step's gradient is their sum), the policy's entropy at each token
        (differentiable), and the rollout correction's weight of each token (None without
        ``optim.rollout_correction``). An implementation takes the arguments it names.

        :return: a ``PolicyLoss`` whose ``loss`` is back-propagated.

        Stops at first non-None result.
        """

    @hookspec
    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        """Called after every training step (a rollout and its updates, logged) with the
        step's metrics (reward, loss, KL, clip fraction, gradient norm, learning rate,
        advantage statistics, timings). For logging; must not modify them.

        :param step: the step just done, 1-based (the ``step`` of its ``metrics.jsonl`` line).

        Called before the step's checkpoint (if it has one) is written, so a
        ``save_plugin_state`` of that checkpoint sees the step done.
        """

    # ------------------------------------------------------------------ lifecycle (named plugins only)
    @hookspec
    def on_run_start(self, model: Any, optimizer: Any, config: Any, output_dir: Path) -> None:
        """Called once per run of ``leaf train`` (and each run of a study), on every
        process, after the model, the optimizer and any checkpoint resumed from are
        loaded and before the first step (before ``load_plugin_state``).

        :param model: the policy: the PeftModel whose LoRA adapter is trained (not the
            DDP wrapper; FSDP2-sharded with ``sharding: fsdp2``).
        :param optimizer: the run's optimizer (accelerate's wrapper of AdamW).
        :param config: the run's ``TrainConfig``.
        :param output_dir: the run directory (``metrics.jsonl``, checkpoints, ...).

        Only the plugins the run config names in ``plugins:`` receive it, as every
        lifecycle hook below.
        """

    @hookspec
    def on_run_end(self, model: Any, optimizer: Any, config: Any, output_dir: Path) -> None:
        """Called once when the run stops training: after its last step and that step's
        checkpoint, or after an interrupt (Ctrl-C, SIGTERM) has saved the run's progress.
        Not called when the run stops on an error. Arguments as ``on_run_start``.
        """

    @hookspec
    def on_optimizer_step(self, model: Any, optimizer: Any, step: int, update: int) -> None:
        """Called after every optimizer step, on every process, with the updated weights.
        A training step makes ``optim.updates_per_rollout × optim.mini_batches`` of them,
        so this is the place to push the adapter to an external rollout engine.

        :param model: the policy (the PeftModel), its adapter just updated.
        :param optimizer: the run's optimizer.
        :param step: the training step being made, 1-based.
        :param update: the optimizer step within it, 0-based.

        A signal is taken before the step's updates or after its log line, never
        between them; keep this short or hand the work to a thread.
        """

    @hookspec
    def save_plugin_state(self, step: int, output_dir: Path) -> Any:
        """The plugin's own state, saved with the checkpoint of ``step`` (1-based) and
        handed back to ``load_plugin_state`` when a run resumes from it, so that a
        resumed run continues exactly where the interrupted one was.

        :return: anything ``torch.save`` can write (a JSON-able value, tensors, a
            state dict), or None to save nothing. It is written by the main process as
            ``plugins/<name>.pt`` in the checkpoint directory, ``<name>`` being the
            plugin's name in ``plugins:`` (characters other than letters, digits, ``-``,
            ``_`` and ``.`` replaced by ``_``).

        Called on the plugin alone (not as a chain over plugins), after ``on_step_end``
        of that step.
        """

    @hookspec
    def load_plugin_state(self, state: Any, step: int, output_dir: Path) -> None:
        """Restore the plugin's state from the checkpoint a run resumes from.

        :param state: what ``save_plugin_state`` returned for that checkpoint (loaded
            on every process, with ``weights_only=False``).
        :param step: the checkpoint's step: the run continues with step ``step + 1``.

        Called on the plugin alone, after ``on_run_start``, and only when the
        checkpoint holds a state of this plugin (a plugin first named on resume starts
        fresh).
        """
