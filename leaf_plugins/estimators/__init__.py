"""The built-in estimators: ``grpo``, ``leaf``, ``collision`` and ``full_tree``.

Each module is a plugin that registers one estimator through ``register_estimators``;
the shared machinery lives in ``boundary_scan`` (the greedy boundary scan),
``prefix_classes`` (exact prefix classes at boundaries), ``prefixes`` (prefix hashes and
the exact lexicographic order of the full tree), ``nodes`` (retained nodes and paths),
``group_stats`` and ``span_credit`` (span advantages and their normalisation).
"""
