"""The TGI step's host reads (adapters/tgi/drafting.py): only a seen request's new ids,
a new request's whole row, in TokenRows that refuse reads outside them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accel_plugin.adapters.tgi.drafting import _read_rows


def test_reads_only_new_ids_of_seen_requests_and_whole_rows_of_new_ones():
    all_ids = torch.arange(4 * 50, dtype=torch.int64).reshape(4, 50)
    batch = SimpleNamespace(all_input_ids_tensor=all_ids)
    rows, starts, num_tokens = [0, 2, 3], [20, -1, 48], np.array([23, 30, 50])
    token_rows = _read_rows(batch, rows, starts, num_tokens)
    assert token_rows.held(0) == (20, 23) and token_rows[0, 20:23].tolist() == all_ids[0, 20:23].tolist()
    assert token_rows.held(1) == (0, 30) and token_rows[1, :30].tolist() == all_ids[2, :30].tolist()
    assert token_rows.held(2) == (48, 50) and token_rows[2, 48:].tolist() == [198, 199]
    with pytest.raises(IndexError, match="row 0 holds tokens 20:23"):
        token_rows[0, :23]


def test_a_seen_request_without_new_ids_holds_nothing():
    batch = SimpleNamespace(all_input_ids_tensor=torch.ones(2, 8, dtype=torch.int64))
    token_rows = _read_rows(batch, [1], [8], np.array([8]))
    assert token_rows.held(0) == (8, 8) and token_rows[0, 8:8].tolist() == []
