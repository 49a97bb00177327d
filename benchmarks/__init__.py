"""GPU benchmarks for accel-plugin's kernels; run ``python -m benchmarks.attention`` (see docs/performance.md)."""
