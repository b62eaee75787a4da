"""The built-in estimators: ``grpo``, ``leaf``, ``collision`` and ``full_tree``.

Each module is a plugin that registers one estimator through ``register_estimators``;
the shared machinery lives in ``prefixes`` (exact prefix groups) and ``span_credit``
(span advantages and their normalisation).
"""
