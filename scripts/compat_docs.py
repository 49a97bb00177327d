#!/usr/bin/env python3
"""Regenerate docs/compatibility.md from the recorded matrix results
(accel_plugin/diagnostics/compat_results.json, written by `nox -s matrix`). `--check` exits 1,
changing nothing, when the page is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel_plugin.diagnostics.compat_page import render  # noqa: E402


def main(argv: list[str]) -> int:
    page = ROOT / "docs/compatibility.md"
    text = render()
    if "--check" in argv:
        if not page.exists() or page.read_text() != text:
            print(f"{page} is out of date: python scripts/compat_docs.py", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
