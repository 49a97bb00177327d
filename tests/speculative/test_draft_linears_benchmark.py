"""``benchmarks/draft_linears.py`` (what NATIVE_BF16_ROWS was chosen from) runs and refuses a bad --draft."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.draft_linears", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_prints_a_row_per_row_count_with_every_product():
    proc = _run("--rows", "1", "3", "--repeats", "2", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| rows | F.linear fp32 | F.linear bf16 | native fp32 | native bf16 |"
    assert [ln.split(" | ")[0] for ln in lines[1:]] == ["| 1", "| 3"]
    assert "(head 4096x576)" in proc.stdout  # the support draft's pruned head, read from its safetensors
    for line in lines[1:]:
        cells = line.strip("| ").split(" | ")[1:]
        assert len(cells) == 4 and all(c == "n/a" or float(c) > 0 for c in cells)


def test_a_folder_without_a_config_is_refused(tmp_path):
    proc = _run("--draft", str(tmp_path))
    assert proc.returncode != 0 and "no config.json there" in proc.stderr


def test_cold_reads_a_buffer_before_each_pass_and_a_negative_size_is_refused():
    proc = _run("--rows", "2", "--repeats", "2", "--threads", "1", "--cold", "8")
    assert proc.returncode == 0, proc.stderr
    assert "8 MB read before each pass (cold)" in proc.stdout
    assert sum(ln.startswith("| 2 | ") for ln in proc.stdout.splitlines()) == 1
    assert "passes back to back (warm)" in _run("--rows", "1", "--repeats", "1", "--threads", "1").stdout
    bad = _run("--cold", "-1")
    assert bad.returncode != 0 and "--cold must be 0 (warm) or a positive number of megabytes; got -1" in bad.stderr
