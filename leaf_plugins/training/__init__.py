"""Training: the loop (``trainer``: rollout → rewards → estimator → loss → optimizer
step) and its parts.

``config`` (the run configuration), ``ranges`` (its numeric limits) and
``estimator_switch`` (which estimator parameters a change of estimator drops);
``rollout`` (K sampled responses per prompt with log-probabilities and surprisal, and
teacher-forced values), ``rollout_backend`` (``rollout.backend``: which engine samples),
``decoding/`` (the ``static`` engine: our decode loop over static K/V buffers),
``generate_rollout`` (the ``generate`` engine, the reference), ``rollout_assembly``
(the ``Rollout`` both engines return), ``token_stats``
(per-token statistics taken at each generation step), ``prompt_embedding`` (prompts
embedded once and shared by their K responses), ``generation_weights`` (sharded weights
gathered once per rollout); ``loss`` (the paper's clipped, KL-regularised token loss),
``selected_logprobs`` (log-softmax of the chosen tokens, chunked), ``aggregation``
(token weights independent of micro-batching), ``update`` (one step's gradient over
micro-batches), ``whole_step`` (each process's share of the step's prompts, and the
whole step gathered onto every process), ``sharding`` (``sharding: fsdp2``); ``lora`` (peft adapters; the reference policy is the adapter disabled),
``checkpointing`` (activation checkpointing), ``warm_start`` (supervised warm start);
``checkpoint`` and ``durable`` (exact resume, crash-safe writes); ``finite`` (guards
against non-finite rewards and losses); ``environment`` (the software and hardware a
run's numbers depend on)."""
