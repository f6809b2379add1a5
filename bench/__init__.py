"""Benchmarks: every figure of ours beside the same figure for a SQLite baseline, in one run."""
