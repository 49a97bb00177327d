"""``python -m benchmarks.attention``: exits cleanly without a GPU, prints its tables with one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(*args, env_changes=None, timeout=60):
    env = dict(os.environ, **(env_changes or {}))
    return subprocess.run([sys.executable, "-m", "benchmarks.attention", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_without_gpu_says_so_and_exits_0():
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    result = run_benchmark("--quick")
    assert result.returncode == 0, result.stderr
    assert "needs a CUDA GPU" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_run_prints_tables():
    result = run_benchmark("--quick", env_changes={"TRITON_INTERPRET": "0"}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "### Prefill" in result.stdout and "### Decode" in result.stdout
