"""The static rollout engine: a lean decode loop of our own over static K/V buffers.

``family``: which models it runs (recognised by their module types and config) and the
family's constants; ``kv_buffers``: the prompts' K/V kept once per prompt and every
row's own generated K/V; ``attention``: grouped-query attention over them without
repeating K/V heads; ``lean_decoder``: the prefill and the one-token step through the
model's own submodules (LoRA layers included); ``sampling_step``: the per-token
statistics and the sample, without host synchronisation; ``keyed_draw``: the sample
drawn from each response's key (seed, group id, k), whatever the batch (both engines
draw with it); ``decode_state``: the static
per-row inputs and outputs of the loop; ``cuda_graph``: the step captured, checked against
the eager step and replayed on CUDA; ``phase_timer``: the prefill, capture and decode
timed apart for benchmarks; ``static_rollout``: the loop itself, producing the same ``Rollout`` as the
``generate`` path.
"""
