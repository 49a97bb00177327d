"""Helpers for tests, demos and benchmarks: tiny local models (no downloads), `vllm serve` subprocesses."""
