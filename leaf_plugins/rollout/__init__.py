"""Sampling: K responses per prompt with their per-token statistics, used by training,
evaluation and the benchmarks. ``sampling.sample_responses`` picks a registered rollout
backend (``backends.py``: ``static``, the decode loop of ``decoding/``, and ``generate``,
Hugging Face ``generate`` with ``token_stats.py``); ``assembly.py`` turns what a backend
sampled into a ``Rollout``. ``log.py``: rollout logs (JSONL), which a run writes and the
forkability analysis reads."""
