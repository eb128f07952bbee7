"""Benchmarks of padded_eval against its anchors: `python -m benchmarks [--quick]`."""
