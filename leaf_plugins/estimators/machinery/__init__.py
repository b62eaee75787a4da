"""Shared machinery of the estimator plugins; it registers nothing.

``prefixes`` (prefix hashes, the exact lexicographic order of the full tree),
``prefix_classes`` (exact prefix classes at boundaries), ``prefix_intervals`` (each
response cut where its path segment or prefix class changes), ``boundary_scan`` (the
greedy boundary scan under the separation rule), ``nodes`` (retained nodes and paths),
``tree_baselines`` (leave-one-out node values along each path), ``node_shrinkage``
(their prior weight, fixed or learnt from the other groups), ``span_credit`` (span
advantages and their normalisation), ``group_stats`` (per-group sums, means and
extremes), ``painting`` (per-token rows from per-segment values) and ``scratch``
(reused buffers for large temporaries).
"""
