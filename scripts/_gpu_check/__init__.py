"""The steps of scripts/gpu_check.py (`make gpu-check`): set-up, the test processes, the report."""
