"""DomainProposer's request states: rows that move, finish and arrive, prompts that
extend or equal each other, with and without request ids; a step reads only the
new tokens and a key's worth of each row; readers in another thread are safe."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from accel_plugin.speculative import DomainProposer
from accel_plugin.speculative.request_states import KEY_TOKENS


def _verifier():
    name = "accel_tests_verifier"
    if name not in sys.modules:  # test_proposer.py may have loaded it
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("verifier.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


V = _verifier()


@pytest.fixture
def proposer_for(make_config, tokenizer):
    def make(yaml_text: str, **kw) -> DomainProposer:
        kw.setdefault("max_len", V.MAX_LEN)
        return DomainProposer(make_config(yaml_text), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                              **kw)

    return make


def ids_of(tokenizer, *texts):
    return [tokenizer(t).input_ids for t in texts]


DRAFTLESS = "num_speculative_tokens: 2\ndefault: {draft: null}\n"


@pytest.mark.parametrize("with_ids", [False, True], ids=["by-tokens", "by-request-id"])
def test_rows_that_move_finish_and_arrive(proposer_for, target, target_dir, tokenizer, with_ids):
    proposer = proposer_for(f"num_speculative_tokens: 3\ndefault: {{draft: {target_dir}}}\n"
                            "controller: {adaptive: false}\n")
    first = [V.Request(p, 6 + 5 * i) for i, p in enumerate(ids_of(tokenizer, "The model is", "def foo(a, b):",
                                                                  "order delivery status please"))]
    later = [V.Request(p, 9, prefill_steps=n) for n, p in zip((1, 2), ids_of(tokenizer, "a b c d", "Customer: my"))]
    trace = V.serve(proposer, target, first, shuffle=11, arrivals={2: later[:1], 4: later[1:]},
                    away={3: [first[2]]}, with_ids=with_ids)
    V.assert_lossless(target, first + later)
    V.check_proposer(proposer, trace, fixed_k={"default": 3})  # one state per decoding row, none for rows gone
    s = proposer.stats()["default"]
    assert s.accepted == s.drafted > 0  # the identical draft: every state was the row's own


@pytest.mark.parametrize("with_ids", [False, True], ids=["by-tokens", "by-request-id"])
def test_a_prompt_equal_to_or_extending_another_running_one(proposer_for, target, target_dir, tokenizer, with_ids):
    proposer = proposer_for(f"num_speculative_tokens: 3\ndefault: {{draft: {target_dir}}}\n"
                            "controller: {adaptive: false}\n")
    (p,) = ids_of(tokenizer, "The model is")
    a = V.Request(list(p), 14)
    # b's prompt is a's prompt and what a generates first: b's rows hold a's earlier tokens
    b_prompt = list(p) + V.plain_greedy(target, list(p), 3)
    reqs = [a, V.Request(b_prompt, 8), V.Request(list(p), 10), V.Request(b_prompt[:-1], 12)]
    trace = V.serve(proposer, target, reqs, shuffle=3, with_ids=with_ids)
    V.assert_lossless(target, reqs)
    V.check_proposer(proposer, trace, fixed_k={"default": 3})


def draftless_steps(prompts: list[np.ndarray], steps: int, *, move: bool, width: int):
    """Decode ``prompts`` ``steps`` times with one random token per row; rows reversed
    every other step when ``move``. Yields the arguments of each propose call."""
    rng = np.random.default_rng(0)
    rows = [list(p) for p in prompts]
    for step in range(steps):
        for row in rows:
            row.append(int(rng.integers(3, 300)))
        if move and step % 2:
            rows.reverse()
        token_ids = np.full((len(rows), width), -1, dtype=np.int32)
        for i, row in enumerate(rows):
            token_ids[i, : len(row)] = row
        yield [[row[-1]] for row in rows], np.array([len(r) for r in rows], dtype=np.int32), token_ids


class CountingTokens:
    """A token array that counts the elements every read of it returns."""

    def __init__(self, array: np.ndarray):
        self.array, self.read = array, 0

    def __getitem__(self, key):
        out = self.array[key]
        self.read += np.asarray(out).size
        return out


@pytest.mark.parametrize("move", [False, True], ids=["rows-stay", "rows-move"])
def test_a_step_reads_the_same_tokens_at_any_context_length(proposer_for, move):
    reads = {}
    for context in (60, 900):
        proposer = proposer_for(DRAFTLESS, max_len=1024)
        prompts = [np.arange(3, 3 + context) % 290 + 3 + i for i in range(4)]
        counts = []
        for sampled, num_tokens, token_ids in draftless_steps(prompts, 8, move=move, width=1024):
            counting = CountingTokens(token_ids)
            proposer.propose(sampled, num_tokens, counting)
            counts.append(counting.read)
        assert proposer.num_states == 4
        reads[context] = counts
    # the first call copies every new row whole (once); after that the context length is irrelevant
    assert reads[60][0] < reads[900][0]
    assert reads[60][1:] == reads[900][1:]
    assert max(reads[900][1:]) == 4 * (2 * KEY_TOKENS + 1)  # two keys and the new token per row


def test_equal_keys_with_different_tokens_are_told_apart_when_rows_move(proposer_for):
    proposer = proposer_for(DRAFTLESS, max_len=1024)
    base = np.arange(500) % 250 + 3
    other = base.copy()
    other[301] = 299  # a position no key reads at these lengths
    sampled, width = [[7], [7]], 1024
    token_ids = np.zeros((4, width), dtype=np.int32)
    for i, row in enumerate((base, other)):
        token_ids[i, :500], token_ids[i, 500] = row, 7
    proposer.propose(sampled, np.array([501, 501]), token_ids)
    states = dict(proposer._states.by_row)
    assert states[0].key == states[1].key  # equal keys, different contexts
    # both move to rows they did not hold, in swapped order: found by their whole contexts
    moved = np.zeros((4, width), dtype=np.int32)
    moved[3], moved[2] = token_ids[0], token_ids[1]
    moved[2:, 501] = 8
    proposer.propose([[], [], [8], [8]], np.array([0, 0, 502, 502]), moved)
    assert proposer._states.by_row[3] is states[0] and proposer._states.by_row[2] is states[1]
    assert proposer._states.by_row[2].context[301] == 299


def test_request_ids_must_be_one_per_row(proposer_for):
    proposer = proposer_for(DRAFTLESS)
    with pytest.raises(ValueError, match="request_ids has 1 ids for 2 rows"):
        proposer.propose([[5], [6]], np.array([3, 3]), np.ones((2, 8), dtype=np.int32), request_ids=["a"])


def test_stats_readers_in_another_thread_during_many_steps(proposer_for, draft_dir):
    # a real draft: the controller's per-bucket stats change while the reader iterates them
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {draft_dir}}}\n", max_len=1024)
    stop, errors, reads = threading.Event(), [], [0]

    def hammer():
        try:
            while not stop.is_set():
                proposer.stats_dict()
                proposer.num_states  # noqa: B018 - a read under the lock
                reads[0] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    reader = threading.Thread(target=hammer)
    reader.start()
    try:
        prompts = [np.arange(3, 40 + 7 * i) for i in range(16)]
        for step, (sampled, num_tokens, token_ids) in enumerate(
                draftless_steps(prompts, 300, move=True, width=1024)):
            n = 4 + step % 13  # the batch changes size: states are created and freed every step
            proposer.propose(sampled[:n], num_tokens[:n], token_ids[:n])
    finally:
        stop.set()
        reader.join()
    assert not errors, errors
    assert reads[0] > 0


def test_a_reader_waits_while_a_step_runs(proposer_for, monkeypatch):
    """While propose() is inside a step, stats_dict() in another thread does not run."""
    proposer = proposer_for(DRAFTLESS)
    done_inside: list[bool] = []
    real_step = proposer.controller.step

    def step_with_a_reader(*args):
        reader = threading.Thread(target=proposer.stats_dict)
        reader.start()
        reader.join(timeout=0.2)
        done_inside.append(not reader.is_alive())  # False: the reader was held back
        real_step(*args)  # the reader finishes once propose returns

    monkeypatch.setattr(proposer.controller, "step", step_with_a_reader)
    proposer.propose([[5]], np.array([4]), np.array([[3, 4, 6, 5]], dtype=np.int32))
    assert done_inside == [False]
