"""TokenRows: reads inside what a row holds, a clear error outside it."""

from __future__ import annotations

import numpy as np
import pytest

from accel_plugin.speculative.token_rows import TokenRows


def test_reads_inside_what_each_row_holds():
    rows = TokenRows({0: (0, np.array([5, 6, 7])), 3: (10, np.array([1, 2]))})
    assert rows[0, :3].tolist() == [5, 6, 7] and rows[0, 1:2].tolist() == [6]
    assert rows[3, 10:12].tolist() == [1, 2] and rows[3, 11:].tolist() == [2] and rows[3, 12:12].tolist() == []
    assert rows.held(3) == (10, 12) and len(rows) == 2


@pytest.mark.parametrize(("key", "error", "match"), [
    ((3, slice(0, 12)), IndexError, "row 3 holds tokens 10:12; asked for 0:12"),
    ((3, slice(10, 13)), IndexError, "asked for 10:13"),
    ((1, slice(0, 1)), IndexError, "row 1 holds no tokens; rows held: \\[0, 3\\]"),
    ((0, slice(0, 3, 2)), TypeError, "token_rows\\[row, start:stop\\]"),
    (0, TypeError, "token_rows\\[row, start:stop\\]"),
])
def test_reads_outside_raise_naming_the_range_held(key, error, match):
    rows = TokenRows({0: (0, np.array([5, 6, 7])), 3: (10, np.array([1, 2]))})
    with pytest.raises(error, match=match):
        rows[key]
