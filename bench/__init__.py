"""Benchmarks: each script measures ratios side by side in one run and writes its results."""
