"""Benchmark reports: estimator speed (``speed``)."""
