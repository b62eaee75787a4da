"""Training: the run loop (``trainer``: rollout → rewards → estimator → updates) and its
parts. Sampling lives in ``leaf_plugins.rollout``.

* The run: ``config`` (the run configuration), ``ranges`` (its numeric limits),
  ``estimator_switch`` (which estimator parameters a change of estimator drops),
  ``run_config`` (``config.yaml`` in the run directory), ``stage_plugins`` (the plugins a
  run names), ``whole_step`` (each process's share of the step's prompts, and the whole
  step gathered onto every process), ``threads``, ``environment`` (what a run's numbers
  depend on), ``finite`` (guards against non-finite rewards and losses).
* The step's data: ``step_sampling`` (rounds of rollouts, dynamic sampling, the step as
  it trains), ``rewards`` (the run's rewards, one or a weighted list), ``overlong``
  (truncated responses: mask or penalty), ``step_metrics`` (what a step logs).
* The update: ``update`` (passes, mini-batches and micro-batches of a step),
  ``teacher_forcing`` and ``selected_logprobs`` (the teacher-forced log-probabilities
  and entropy), ``loss`` (the clipped, KL-regularised token loss and its variants:
  clip-higher, dual clip, GSPO's sequence ratio, k1/k2/k3, entropy bonus),
  ``importance_correction`` (TIS/MIS for the rollout/training mismatch), ``aggregation``
  (token weights independent of micro-batching), ``optimization`` (AdamW, the
  learning-rate schedule, gradient clipping), ``lora`` (peft adapters; the reference
  policy is the adapter disabled), ``keyed_dropout``, ``activation_checkpointing``,
  ``sharding`` (``sharding: fsdp2``).
* Checkpoints: ``checkpoint`` and ``durable`` (exact resume, crash-safe writes).
* Watching runs: ``trackers`` (``report_to``), ``run_status`` (``status.json``),
  ``run_directory`` and ``run_curves`` (what ``leaf runs`` reads and plots).
* ``warm_start``: the supervised warm start.
"""
