"""Request states: keys read a bounded number of tokens and tell contexts apart by
length and by the tokens they read; buffers grow by doubling; the index finds
states by row, key and request id."""

from __future__ import annotations

import numpy as np

from accel_plugin.speculative.request_states import (
    KEY_TOKENS,
    RequestState,
    StateIndex,
    row_keys,
)


def test_keys_depend_on_the_length_and_the_tokens_they_read():
    tokens = np.arange(1000, dtype=np.int32)[None].repeat(3, axis=0)
    tokens[1, 999] = -5  # the last token: read by the key of length 1000
    tokens[2, 500] = -5  # a position not read at length 1000
    a, b, c = row_keys(tokens, np.arange(3), np.array([1000, 1000, 1000]))
    assert a != b and a == c
    assert row_keys(tokens, np.array([0]), np.array([999])) != [a]  # another length, another key
    # int32 rows and the int64 buffer of a state holding the same tokens have the same key
    state = RequestState.start("d", tokens[0].astype(np.int64))
    assert row_keys(state.buffer[None], np.array([0]), np.array([state.length])) == [a]
    assert len(a[1]) == 8 * KEY_TOKENS


def test_short_contexts_get_keys_of_their_own_tokens_only():
    tokens = np.full((2, 64), 9, dtype=np.int64)
    tokens[:, :3] = [[1, 2, 3], [1, 2, 4]]
    k0, k1 = row_keys(tokens, np.arange(2), np.array([3, 3]))
    assert k0 != k1  # padding past the length is never read
    assert row_keys(tokens, np.arange(2), np.array([2, 2]))[0] == row_keys(tokens, np.arange(2), np.array([2, 2]))[1]


def test_buffer_grows_by_doubling_and_the_context_is_a_read_only_view():
    state = RequestState.start("d", np.arange(10))
    capacity = len(state.buffer)
    state.extend(np.array([10, 11]))
    assert state.context.tolist() == list(range(12)) and len(state.buffer) == capacity
    state.extend(np.arange(12, 100))
    assert state.context.tolist() == list(range(100)) and len(state.buffer) >= 100
    assert not state.context.flags.writeable


def test_index_finds_by_row_key_and_request_id():
    index = StateIndex()
    tokens = np.arange(40, dtype=np.int64)[None].repeat(2, axis=0)
    tokens[1, 20] = 99  # equal keys (position 20 is not read at length 40), other contexts
    states = []
    for row in range(2):
        s = RequestState.start("d", tokens[row], request_id=f"r{row}", row=row)
        s.key = row_keys(tokens, np.array([row]), np.array([40]))[0]
        index.add(s)
        states.append(s)
    assert states[0].key == states[1].key
    assert index.keep_only(states) == []
    # rows swapped into rows they never held: told apart by their whole contexts
    moved = tokens[::-1].copy()
    keys = row_keys(moved, np.arange(2), np.array([40, 40]))
    swapped = StateIndex()
    for s in states:
        s.row = s.row + 5
        swapped.add(s)
    swapped.keep_only(states)
    assert swapped.find(0, keys[0], moved, set()) is states[1]
    assert swapped.find(1, keys[1], moved, {states[1]}) is states[0]
    assert index.find_request("r1", 40, set()) is states[1]
    assert index.find_request("r1", 41, set()) is None  # another length: a new request with that id
    assert index.find_request("r1", 40, {states[1]}) is None
    assert index.keep_only([states[0]]) == [states[1]] and len(index) == 1
