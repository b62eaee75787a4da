"""Benchmarks behind ``leaf bench``: ``speed`` (the estimator speed table from a
pytest-benchmark JSON file), ``step`` (one training step's time per phase and peak
memory, beside the reference path kept in ``step_reference``), ``rollout`` (both
rollout backends' ms per generated token against the memory-bandwidth floor),
``step_accounting``
(bytes per tensor class of a step at the real models' shapes, by arithmetic) and
``credit/`` (credit quality against exact ground truth)."""
