"""Benchmarks: each prints its figures; `python -m bench` (or `make bench`) runs them all."""
