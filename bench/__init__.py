"""Benchmarks (issue 8): one script per figure; see docs/benchmarks.md."""
