"""The load test: `vllm serve` with accel under concurrent streaming clients, against stock (`python -m benchmarks.load`)."""
