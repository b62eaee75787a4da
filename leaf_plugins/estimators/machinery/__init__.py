"""Shared machinery of the estimator plugins (moved from estimators/)."""
