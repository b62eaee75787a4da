"""The built-in estimators, one plugin module each, and their shared machinery.

Plugins (each registers one estimator through ``register_estimators``): ``grpo``
(group-normalised reward), ``leaf`` (the paper's high-surprisal boundaries and span
credit), ``collision`` (LEAF's credit at boundaries of largest prefix-collision mass),
``full_tree`` (every branching set of the exact prefix trie), ``otb`` (verl's optimal
token baseline), ``tree_rloo`` (prefix leave-one-out baselines, unbiased) and
``tree_otb`` (the variance-aware prefix baseline).

``machinery/``: what several of them share, and no estimator of its own (prefix hashes
and orders, prefix classes and intervals, retained nodes, the boundary scan, node values
and their shrinkage, span credit, per-group statistics, row painting, scratch buffers).
"""
