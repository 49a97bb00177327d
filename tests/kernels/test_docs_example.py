"""The first python example in docs/kernels.md runs as written."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernels.md"


def test_first_example_runs():
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert match, "docs/kernels.md has no ```python block"
    exec(compile(match.group(1), str(DOC), "exec"), {"__name__": "docs_example"})
