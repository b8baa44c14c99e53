"""Evaluation helpers: the unbiased pass@k / pass^k estimators."""
