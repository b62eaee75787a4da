"""Training: the run loop (``trainer``: rollout → rewards → estimator → updates) and its
parts. Sampling lives in ``leaf_plugins.rollout``.

* The run: ``config`` (the run configuration), ``ranges`` (its numeric limits),
  ``estimator_switch`` (which estimator parameters a change of estimator drops),
  ``run_config`` (``config.yaml`` in the run directory), ``stage_plugins`` (the plugins a
  run names), ``whole_step`` (each process's share of the step's prompts, and the whole
  step gathered onto every process), ``threads``, ``environment`` (what a run's numbers
  depend on), ``finite`` (guards against non-finite rewards and losses).
* The update: ``update`` (passes, mini-batches and micro-batches of a step),
  ``teacher_forcing`` and ``selected_logprobs`` (the teacher-forced log-probabilities),
  ``loss`` (the paper's clipped, KL-regularised token loss), ``aggregation`` (token
  weights independent of micro-batching), ``optimization`` (AdamW, the learning-rate
  schedule, gradient clipping), ``lora`` (peft adapters; the reference policy is the
  adapter disabled), ``activation_checkpointing``, ``sharding`` (``sharding: fsdp2``).
* Checkpoints: ``checkpoint`` and ``durable`` (exact resume, crash-safe writes).
* ``warm_start``: the supervised warm start.
"""
