"""The training loop: rollout → rewards → estimator → clipped KL loss → optimizer step.

Rollout, scoring and the loss are hooks (``rollout``, ``score_rollouts``,
``compute_loss``) on the run's plugin manager, next to the estimator's stages, so a
plugin the run config names in ``plugins:`` replaces any of them (``stage_plugins.py``).
Runs work unchanged under ``accelerate launch`` or ``torchrun`` and train what one process
trains: each process samples its share of the step's prompts with the same per-response
sampling keys, every process estimates on the whole step (``whole_step.py``), and DDP
sums the shares' gradients into the step's. They resume exactly from their newest checkpoint.
Ctrl-C or SIGTERM, to any process, stops every process at the same safe point (the start
of a step, or after the step's rollout): the last completed step is saved, unless a
checkpoint holds it already, and the run stops (``core/interrupts.py``).
"""

from __future__ import annotations

import atexit
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from tqdm import tqdm

from leaf_plugins.rollout.log import RolloutLogger
from leaf_plugins.core.engine import Engine
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.hookspecs import hookimpl
from leaf_plugins.core.interrupts import Interrupted, stop_on_signals
from leaf_plugins.core.plugins import PluginHost, get_host
from leaf_plugins.core.processes import agreed_interrupt_point
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.stages import PolicyLoss, Rollout, RolloutRequest, StepContext
from leaf_plugins.core.task import Example
from leaf_plugins.training.checkpoint import (latest_checkpoint, load_checkpoint, load_plugin_states, remove_partials,
                                              save_checkpoint)
from leaf_plugins.training.config import TrainConfig, rollout_field_problem
from leaf_plugins.training.activation_checkpointing import enable_activation_checkpointing
from leaf_plugins.training.durable import truncate_log
from leaf_plugins.training.environment import record_environment
from leaf_plugins.training.finite import scorer_name
from leaf_plugins.training.keyed_dropout import install_keyed_dropout
from leaf_plugins.training.lora import attach_lora
from leaf_plugins.training.loss import LossSettings, policy_loss
from leaf_plugins.training.optimization import build_optimizer, build_schedule, set_schedule_step
from leaf_plugins.rollout.assembly import audio_token_ids
from leaf_plugins.rollout.backends import resolve_backend
from leaf_plugins.training.rewards import RunRewards, reward_entries
from leaf_plugins.training.run_config import check_resumed_config, resolved_config, write_run_config
from leaf_plugins.training.run_status import RunStatus, write_status
from leaf_plugins.training.step_metrics import POSTFIX, step_metrics
from leaf_plugins.training.step_sampling import assemble_step, choose_groups, round_seed, sample_round
from leaf_plugins.training.trackers import PROJECT_NAME, check_trackers, tracker_init_kwargs
from leaf_plugins.training.sharding import prepare_training, shard_policy
from leaf_plugins.training.stage_plugins import call_plugin_hook, record_plugins, register_stage_plugins, resolve_plugins
from leaf_plugins.training.threads import apply_threads
from leaf_plugins.rollout.prompt_embedding import with_prompt_embeddings
from leaf_plugins.training.update import Learner, StepData, reference_logprobs, update_policy
from leaf_plugins.training.whole_step import check_world, prompt_share

__all__ = ["DefaultStages", "Trainer", "ROLLOUT_LOG"]

ROLLOUT_LOG = "rollouts.jsonl"  # in the run's output directory, with ``log_rollouts: true``


class DefaultStages:
    """The built-in rollout (``rollout.backend``: the static decode loop, Hugging Face
    ``generate`` or a registered backend), scoring (the weighted sum of the run's
    rewards against each example's reference) and loss (paper Eq. 1 with the run's loss
    settings). Their hooks are ``trylast``: a plugin's implementation always comes first."""

    def __init__(self, rewards: RunRewards | None, backend: str, sampler: Any) -> None:
        self.rewards = rewards  # the run's rewards, each configured with its parameters
        self.backend = backend  # the name of the run's rollout backend (rollout.backend, resolved for the model)
        self.sampler = sampler  # that backend, configured with rollout.backend_params
        self.fields: frozenset[str] | None = None  # the optional per-token statistics the run's estimator reads

    @hookimpl(trylast=True)
    def rollout(self, context: StepContext) -> Rollout:
        settings = context.config.rollout
        # with the group ids, the seed gives the same responses on any number of processes
        return self.sampler.sample(RolloutRequest(
            context.model, context.loaded, context.inputs, settings.group_size, settings.max_new_tokens,
            settings.temperature, settings.top_p, settings.surprisal_from, group_ids=context.group_ids,
            context=context, seed=context.config.seed, fields=self.fields))

    @hookimpl(trylast=True)
    def compute_loss(self, context: StepContext, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                     reference_logprobs: torch.Tensor | None, advantages: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor, entropy: torch.Tensor, correction: torch.Tensor | None) -> PolicyLoss:
        return policy_loss(logprobs, old_logprobs, reference_logprobs, advantages, mask,
                           LossSettings.of(context.config.optim), weights, entropy, correction)

    @hookimpl(trylast=True)
    def score_rollouts(self, context: StepContext, rollout: Rollout) -> torch.Tensor:
        return self.rewards.total(self.rewards.scores(rollout, context.examples))


class Trainer:
    """One run: ``Trainer(config, examples).run()``.

    ``plugins`` are observers passed in code (a progress display, a test's probe): they
    receive ``on_step_end`` and ``on_estimate`` alone (``Engine``). A plugin that changes
    the run (a stage, a lifecycle hook, a saved state) is named in the run config's
    ``plugins:``, where it is guarded, recorded in ``plugins.json`` and ``config.yaml``,
    and checked on resume."""

    def __init__(
        self,
        config: TrainConfig,
        examples: Sequence[Example],
        plugins: Sequence[object] = (),
        accelerator: Accelerator | None = None,
        host: PluginHost | None = None,
    ) -> None:
        if not examples:
            raise ValueError("no training examples")
        self.config = config
        self.examples = list(examples)
        self.output_dir = Path(config.output_dir)
        check_trackers(config.report_to)
        # without an accelerator, several processes (accelerate launch / torchrun) use gloo on CPU
        self.accelerator = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(), log_with=list(config.report_to) or None, project_dir=str(self.output_dir)
        )
        host = host or get_host()
        self.backbone = host.backbones.get(config.backbone.name)
        self.rewards = RunRewards(reward_entries(config.reward, config.reward_params), host)
        check_world(config.rollout.prompts_per_step, self.accelerator.num_processes)  # before the model loads
        problem = rollout_field_problem(config, host)  # the rollout gives the estimator what it reads
        if problem:
            raise ConfigError(problem)
        check_resumed_config(self.output_dir, config, host)  # a resume trains what its checkpoint's run trained
        self.host = host
        if config.optim.mini_batches > config.rollout.prompts_per_step:
            raise ConfigError(f"optim.mini_batches={config.optim.mini_batches} is more than the "
                              f"rollout.prompts_per_step={config.rollout.prompts_per_step} prompts of a step")
        if self.accelerator.num_processes > 1:
            atexit.register(_destroy_process_group)
        torch.manual_seed(config.seed)
        self.loaded = self.backbone.load(path=config.backbone.path, dtype=config.backbone.dtype, seed=config.backbone.seed)
        share = len(prompt_share(config.rollout.prompts_per_step, 0, self.accelerator.num_processes))  # the largest
        self.threads = apply_threads(config.threads, self.loaded.model, rows=share * config.rollout.group_size)
        model = attach_lora(self.loaded, config.lora.rank, config.lora.alpha, config.lora.dropout)
        install_keyed_dropout(model)  # dropout masks keyed by each row, not by its micro-batch or process
        if config.optim.activation_checkpointing:
            enable_activation_checkpointing(model)
        if config.sharding == "fsdp2":
            model = shard_policy(model, self.accelerator)  # FSDP2 per decoder layer, then the root
        optimizer = build_optimizer((p for p in model.parameters() if p.requires_grad), config.optim.learning_rate,
                                    config.optim.weight_decay)
        self.model, self.optimizer = prepare_training(self.accelerator, model, optimizer)  # DDP unless sharded
        self.scheduler = build_schedule(self.optimizer, config.steps, config.optim.lr_schedule,
                                        config.optim.warmup_steps)
        self.completed = 0  # training steps done (each one logged in metrics.jsonl)
        self.saved = 0  # the step of the newest checkpoint (0: none)
        self.audio_tokens = torch.tensor(audio_token_ids(self.loaded))  # [A] placeholder ids, not prompt text
        # the main process logs every group of every step (the estimator sees the whole step; 1-based step numbers)
        self.rollout_logger = (RolloutLogger(self.output_dir / ROLLOUT_LOG)
                               if config.log_rollouts and self.accelerator.is_main_process else None)
        backend = resolve_backend(self.policy, config.rollout.backend, host)  # static where supported
        sampler = configured("rollout backend", backend, host.rollout_backends.get(backend),
                             config.rollout.backend_params)
        stages = DefaultStages(self.rewards, backend, sampler)
        self.engine = Engine(config.estimator.name, config.estimator.params, config.estimator.stages,
                             observers=[*([self.rollout_logger] if self.rollout_logger else []), *plugins], host=host)
        stages.fields = frozenset(self.engine.requires)  # the rollout computes only what the estimator reads
        self.engine.manager.register(stages, name="defaults:stages")
        self.stage_plugins = resolve_plugins(config.plugins, host)  # those the run config names, first named first
        register_stage_plugins(self.engine.manager, self.stage_plugins)

    @property
    def policy(self) -> Any:
        """The PeftModel itself (not the DDP wrapper)."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def learner(self) -> Learner:
        """What the update steps: the wrapped model, the PeftModel, the optimizer, the
        accelerator, the run's ``compute_loss`` hook and the output directory."""
        return Learner(self.model, self.policy, self.optimizer, self.accelerator, self.engine.manager.hook.compute_loss,
                       self.output_dir)

    # ------------------------------------------------------------------ the run
    def run(self) -> list[dict[str, float]]:
        """Train from the newest checkpoint (or the start) to ``config.steps``; return the
        metrics of the steps run now. SIGINT or SIGTERM stops every process at the run's
        next safe point (``core/interrupts.py``): the last completed step is saved, if no
        checkpoint holds it yet, and an ``Interrupted`` is raised with ``kept`` naming the
        checkpoint that holds the run's progress."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with stop_on_signals():  # nothing when `leaf` records the signals already
            try:
                done = self._train()
            except KeyboardInterrupt as interrupt:  # the weights are those of the last completed (logged) step
                # an Interrupted comes from a point every process reached; another KeyboardInterrupt (a
                # signal handler of the caller's) is safe to save after on one process only
                if self.completed > self.saved and (isinstance(interrupt, Interrupted)
                                                    or self.accelerator.num_processes == 1):
                    self._save(self.completed)
                interrupt.kept = self._kept()  # type: ignore[attr-defined]
                self._lifecycle("on_run_end")
                self._status("interrupted", str(interrupt) or "SIGINT")
                raise
            except Exception as error:
                self._status("failed", f"{type(error).__name__}: {error}")
                raise
        self._status("finished")
        return done

    def _train(self) -> list[dict[str, float]]:
        start, resumed_from = self._resume()
        if self.accelerator.is_main_process:
            record_environment(self.output_dir, threads_reason=self.threads.reason)
            record_plugins(self.output_dir, self.stage_plugins, start)
            write_run_config(self.output_dir, self.config, self.host)
        self._lifecycle("on_run_start")
        self._load_plugin_states(resumed_from, start)
        self._status("running")
        if self.accelerator.is_main_process and self.config.report_to:
            self.accelerator.init_trackers(PROJECT_NAME, config=_flat(resolved_config(self.config, self.host)),
                                           init_kwargs=tracker_init_kwargs(self.config.report_to, self.output_dir,
                                                                           self.output_dir.name))
        done: list[dict[str, float]] = []
        progress = tqdm(total=self.config.steps, initial=start, desc="training", unit="step",
                        disable=not self.accelerator.is_main_process)
        try:
            while self.completed < self.config.steps:
                agreed_interrupt_point()  # a signal to any process stops all of them here, before the step
                metrics = self.train_step(self.completed)  # updates the policy, logs the step
                step = self.completed
                done.append(metrics)
                self.engine.manager.hook.on_step_end(step=step, metrics=metrics)
                progress.update(1)
                progress.set_postfix({name: f"{metrics[name]:.4g}" for name in POSTFIX})
                if step % self.config.checkpoint_every == 0 or step == self.config.steps:
                    self._save(step)
        finally:
            progress.close()
            for tracker in self.accelerator.trackers:  # the process group stays: a study trains run after run
                tracker.finish()
        self._lifecycle("on_run_end")
        return done

    def _lifecycle(self, hook: str) -> None:
        """Call the run-wide lifecycle ``hook`` (``on_run_start``, ``on_run_end``)."""
        getattr(self.engine.manager.hook, hook)(model=self.policy, optimizer=self.optimizer, config=self.config,
                                                 output_dir=self.output_dir)

    def _load_plugin_states(self, checkpoint: Path | None, step: int) -> None:
        """Hand each named plugin its state saved in ``checkpoint`` (of step ``step``), the
        one the run resumed from (None: it started afresh)."""
        if checkpoint is None:
            return
        states = load_plugin_states(checkpoint, [plugin.name for plugin in self.stage_plugins])
        for plugin in self.stage_plugins:
            if plugin.name in states:
                call_plugin_hook(self.engine.manager, plugin, "load_plugin_state", state=states[plugin.name], step=step,
                                 output_dir=self.output_dir)

    def _plugin_states(self, step: int) -> dict[str, Any]:
        """The state each named plugin saves with the checkpoint of ``step`` (None: nothing)."""
        states = {}
        for plugin in self.stage_plugins:
            saved = call_plugin_hook(self.engine.manager, plugin, "save_plugin_state", step=step,
                                     output_dir=self.output_dir)
            if saved:  # pluggy leaves out None results
                states[plugin.name] = saved[0]
        return states

    def train_step(self, step: int) -> dict[str, float]:
        """One training step (its rounds of rollouts, then its updates:
        ``training/step_sampling.py``, ``training/update.py``), logged in
        ``metrics.jsonl``; ``self.completed`` becomes ``step + 1`` (``step`` counts the
        steps done before it). A signal received by any process stops all of them after
        a round's rollout, before anything is trained (an agreed interrupt point), so an
        interrupt never finds weights that are ahead of the log.

        Each process samples and scores its share of a round's prompts; the rollouts are
        then gathered (``whole_step.py``), so every process screens the rewards, chooses
        the step's groups, runs the estimator and computes the metrics on the whole step,
        as one process would, and back-propagates the loss of its own rows."""
        config, accelerator = self.config, self.accelerator
        started = time.perf_counter()
        cuda = accelerator.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(accelerator.device)
        torch.manual_seed(config.seed * 1_000_003 + step * 1_009)  # for plugins that draw from torch's generator
        rank, world = accelerator.process_index, accelerator.num_processes
        rounds, chosen = [], None
        planned = config.rollout.max_sampling_rounds if config.rollout.dynamic_sampling else 1
        for number in range(planned):
            rounds.append(sample_round(number, self._prompts_of(step, number), self._context_of(step), self, rank,
                                       world, accelerator.device))
            if config.rollout.dynamic_sampling:
                chosen = choose_groups(rounds, config.rollout.prompts_per_step, last_round=number == planned - 1)
                if chosen is not None:
                    break
        dropped = sum(len(sampled.dropped) for sampled in rounds)
        if dropped and accelerator.is_main_process:
            tqdm.write(f"step {step + 1}: {dropped} group(s) with a non-finite reward dropped")
        tokenizer = self.loaded.tokenizer
        assembled = assemble_step(rounds, chosen, rank, world, config, tokenizer.eos_token_id, tokenizer.pad_token_id)
        sampled = time.perf_counter()
        estimated_rows = assembled.estimated.nonzero().squeeze(1)
        batch = assembled.whole.select(estimated_rows)
        if self.rollout_logger is not None:
            self.rollout_logger.step = step + 1
        result = self.engine.estimate(batch)
        estimated = time.perf_counter()
        advantages = torch.zeros(assembled.whole.tokens.shape, dtype=result.advantages.dtype)  # [N, T] whole step
        advantages[estimated_rows] = result.advantages.to(advantages.device)
        self.model.train()
        own, width = assembled.own, assembled.rollout.batch.width
        data = StepData(assembled.context, assembled.rollout, advantages[own, :width], assembled.trained[own],
                        assembled.whole, assembled.positions, assembled.trained, assembled.shares, assembled.reference)
        updates = update_policy(self.learner, data, after_step=lambda update: self.hook.on_optimizer_step(
            model=self.policy, optimizer=self.optimizer, step=step + 1, update=update))
        metrics = step_metrics(assembled, result.advantages, updates, self.rewards.names,
                               config.rollout.overlong == "penalty" or LossSettings.of(config.optim).kl_in_reward)
        finished = time.perf_counter()
        metrics.update(rollout_seconds=sampled - started, estimator_seconds=estimated - sampled,
                       update_seconds=finished - estimated,
                       tokens_per_second=float(batch.lengths.sum()) / max(finished - started, 1e-9))
        if cuda:
            metrics["peak_memory_bytes"] = float(self._most_over_processes(torch.cuda.max_memory_allocated()))
        self.scheduler.step()
        self.completed += 1
        self._log(self.completed, metrics)
        self.model.eval()
        return metrics

    def _context_of(self, step: int) -> Callable[[list[Example], range, int], StepContext]:
        """A round's step context of this process's share (its prompts' inputs built,
        their lengths checked, their audio embedded once)."""

        def context(examples: list[Example], share: range, number: int) -> StepContext:
            inputs = self.backbone.build_inputs(self.loaded, [e.prompt for e in examples], [e.audio for e in examples])
            inputs = {key: value.to(self.accelerator.device) for key, value in inputs.items()}
            self._check_prompt_lengths(examples, inputs)
            inputs = with_prompt_embeddings(self.policy, inputs)  # audio encoded once per prompt for the whole step
            return StepContext(step + 1, self.policy, self.loaded, examples, inputs, self.config,
                               first_prompt=share.start, sampling_round=number, rewards=self.rewards)

        return context

    @property
    def hook(self) -> Any:
        """The run's hooks (the plugin manager's hook caller)."""
        return self.engine.manager.hook

    @property
    def scorer(self) -> str:
        """Who scores the responses, for messages."""
        return scorer_name(self.hook, self.rewards.names)

    def reference(self, context: StepContext, rollout: Rollout, shares: tuple[tuple[int, ...], ...]) -> torch.Tensor:
        """``[n, T]`` log π_ref of this process's rows of ``rollout`` (``optim.kl_in: reward``)."""
        return reference_logprobs(self.learner, context, rollout, shares)

    def _most_over_processes(self, value: int) -> int:
        """The largest of every process's ``value``."""
        if self.accelerator.num_processes == 1:
            return value
        most = torch.tensor([value], dtype=torch.int64, device=self.accelerator.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return int(most.item())

    # ------------------------------------------------------------------ pieces
    def _check_prompt_lengths(self, examples: list[Example], inputs: dict[str, torch.Tensor]) -> None:
        limit = self.config.rollout.max_prompt_tokens
        text = (inputs["attention_mask"].bool() & ~torch.isin(inputs["input_ids"].cpu(), self.audio_tokens).to(
            inputs["attention_mask"].device)).sum(dim=1)  # [P]
        for example, count in zip(examples, text.tolist()):
            if count > limit:
                raise ConfigError(f"example {example.id!r}: its prompt has {count} text tokens, more than "
                                  f"rollout.max_prompt_tokens={limit}")

    def _prompts_of(self, step: int, number: int = 0) -> list[Example]:
        """The prompts of round ``number`` of the step, in step order; process r samples
        ``prompt_share(len(...), r, world)`` of them. Round 0 takes the data in epochs of
        seeded permutations; a later round (``rollout.dynamic_sampling``) draws from a
        permutation keyed by the seed, the step and the round (``round_seed``)."""
        count = len(self.examples)
        per_step = self.config.rollout.prompts_per_step
        if number:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(round_seed(self.config.seed, step,
                                                                                               number)))
            return [self.examples[int(order[slot % count])] for slot in range(per_step)]
        chosen = []
        for slot in range(step * per_step, (step + 1) * per_step):
            epoch, position = divmod(slot, count)
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.config.seed * 7919 + epoch))
            chosen.append(self.examples[int(order[position])])
        return chosen

    def _resume(self) -> tuple[int, Path | None]:
        """Load the newest checkpoint, if any; return the step reached and the checkpoint."""
        found = latest_checkpoint(self.output_dir)
        step = 0 if found is None else load_checkpoint(found, self.policy, self.optimizer, self.accelerator,
                                                      self.scheduler)
        set_schedule_step(self.scheduler, step)
        self.completed = self.saved = step
        if found is not None and self.accelerator.is_main_process:
            left = f"{self.config.steps - step} to go" if step < self.config.steps else "nothing left to train"
            tqdm.write(f"resuming from {found} (step {step} of {self.config.steps}; {left})")
        if self.accelerator.is_main_process:  # drop steps logged after that checkpoint (and a torn last line)
            remove_partials(self.output_dir)
            for log in (self.output_dir / "metrics.jsonl", self.output_dir / ROLLOUT_LOG):
                truncate_log(log, lambda record: record["step"] <= step)
        return step, found

    def _save(self, step: int) -> None:
        """Checkpoint ``step`` (every process writes its part: RNG states, shards)."""
        save_checkpoint(self.output_dir, step, self.policy, self.optimizer, self.accelerator, self.scheduler,
                        keep=self.config.keep_checkpoints, plugin_states=self._plugin_states(step))
        self.saved = step

    def _kept(self) -> str:
        """What an interrupted run keeps, in words: its newest checkpoint."""
        found = latest_checkpoint(self.output_dir)
        if found is None:
            return f"no checkpoint yet in {self.output_dir} (no step completed)"
        return f"{found} (step {int(found.name.split('-')[1])} of {self.config.steps})"

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.accelerator.is_main_process:
            return
        with (self.output_dir / "metrics.jsonl").open("a") as handle:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")
        self.accelerator.log(metrics, step=step)

    def _status(self, state: str, message: str = "") -> None:
        """Record the run's state in ``status.json`` (the main process): running, finished,
        interrupted or failed (with what failed)."""
        if self.accelerator.is_main_process:
            write_status(self.output_dir, RunStatus(state, self.completed, self.config.steps, message))


def _destroy_process_group() -> None:
    """End the process group at exit (once, after every run of the process: a study
    trains several in one launch), so that no rank aborts in the interpreter's teardown."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config as flat ``a.b`` keys with scalar values (for trackers): a list (a
    reward list, the plugins) as its JSON text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        elif value is None or isinstance(value, (int, float, str, bool)):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out

