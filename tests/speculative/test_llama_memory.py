"""The draft KV cache follows the live requests: it grows by doubling, shrinks when
slots are freed and it is mostly unused, keeps the surviving requests' K/V exactly,
and does not alternate between growing and shrinking around one size."""

from __future__ import annotations

import pytest
import torch

from accel_plugin.speculative.llama import LlamaDraftModel

MAX_LEN = 512
INITIAL_SLOTS = 4


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models("draft-d32")


def prefill(model: LlamaDraftModel, seqs: list[list[int]], slots: list[int]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    return model.forward(tokens, torch.zeros(len(seqs), dtype=torch.long),
                         torch.tensor([len(s) for s in seqs]), torch.tensor(slots))


def step(model: LlamaDraftModel, seqs: list[list[int]], new: list[int], slots: list[int]) -> torch.Tensor:
    return model.forward(torch.tensor(new)[:, None], torch.tensor([len(s) for s in seqs]),
                         torch.ones(len(seqs), dtype=torch.long), torch.tensor(slots))


def small_level(model_dir) -> int:
    """What a model that only ever served the few short requests holds."""
    return LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=INITIAL_SLOTS).kv_bytes


def test_burst_of_long_requests_then_a_few_short_ones_returns_to_the_small_level(model_dir):
    gen = torch.Generator().manual_seed(0)
    model = LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=INITIAL_SLOTS)
    small = model.kv_bytes
    assert small == small_level(model_dir)
    # a burst: 40 requests of 300-400 tokens (rows and positions both grow by doubling)
    burst = [torch.randint(0, 384, (300 + 2 * i,), generator=gen).tolist() for i in range(40)]
    burst_slots = [model.alloc_slot() for _ in burst]
    for lo in range(0, len(burst), 8):
        prefill(model, burst[lo: lo + 8], burst_slots[lo: lo + 8])
    assert model.num_slots == 64 and model.capacity == MAX_LEN
    peak = model.kv_bytes
    assert peak == small * (64 // INITIAL_SLOTS) * (MAX_LEN // 128)
    # two short requests arrive while the burst is still running, then the burst ends
    short = [torch.randint(0, 384, (n,), generator=gen).tolist() for n in (9, 30)]
    short_slots = [model.alloc_slot() for _ in short]
    prefill(model, short, short_slots)
    for slot in burst_slots:
        model.free_slot(slot)
    assert model.num_slots == INITIAL_SLOTS and model.capacity == 128
    assert model.kv_bytes == small
    assert model.num_free_slots == INITIAL_SLOTS - len(short)
    # the survivors' K/V moved rows but their handles and cached tokens are intact
    for _ in range(3):
        new = torch.randint(0, 384, (len(short),), generator=gen).tolist()
        logits = step(model, short, new, short_slots)
        short = [s + [t] for s, t in zip(short, new)]
        fresh = LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=2)
        expected = prefill(fresh, short, [fresh.alloc_slot() for _ in short])
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_shrink_keeps_a_long_survivor_and_frees_the_rest(model_dir):
    """One long request outlives the burst: positions stay, rows go."""
    model = LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=INITIAL_SLOTS)
    seqs = [[3 + (i * 7 + j) % 300 for j in range(200)] for i in range(20)]
    slots = [model.alloc_slot() for _ in seqs]
    prefill(model, seqs, slots)
    assert (model.num_slots, model.capacity) == (32, 256)
    for slot in slots[:-1]:
        model.free_slot(slot)
    assert (model.num_slots, model.capacity) == (INITIAL_SLOTS, 256)  # 200 cached > 256 / 4
    logits = step(model, seqs[-1:], [5], slots[-1:])
    fresh = LlamaDraftModel(model_dir, max_len=MAX_LEN)
    expected = prefill(fresh, [seqs[-1] + [5]], [fresh.alloc_slot()])
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    model.free_slot(slots[-1])
    assert model.kv_bytes == small_level(model_dir)


def test_no_thrash_around_a_boundary(model_dir, monkeypatch):
    """Requests arriving and leaving one at a time around a power of two resize once."""
    model = LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=1)
    resizes = []
    original = model.kv._resize
    monkeypatch.setattr(model.kv, "_resize", lambda s, c: (resizes.append((s, c)), original(s, c)))
    held = [model.alloc_slot() for _ in range(8)]  # grows 1 -> 2 -> 4 -> 8
    assert len(resizes) == 3
    resizes.clear()
    for _ in range(20):  # the 9th request comes and goes
        extra = model.alloc_slot()
        model.free_slot(extra)
    assert resizes == [(16, 128)]
    for slot in held:
        model.free_slot(slot)
    assert model.num_slots == 1


def test_freeing_twice_or_an_unknown_slot_is_harmless(model_dir):
    model = LlamaDraftModel(model_dir, max_len=64, initial_slots=2)
    a = model.alloc_slot()
    model.free_slot(a)
    model.free_slot(a)
    model.free_slot(99)
    assert model.num_free_slots == 2
    assert {model.alloc_slot(), model.alloc_slot()} == {0, 1}


def test_a_shrink_on_cpu_gives_the_freed_pages_back(model_dir, monkeypatch):
    """After a shrink the C heap's free pages go back to the operating system
    (malloc_trim), once per shrink and never on a grow or a free without shrink."""
    from accel_plugin.speculative import draft_kv, host_memory

    calls = []
    monkeypatch.setattr(draft_kv, "release_freed_memory", lambda: calls.append(1) or True)
    model = LlamaDraftModel(model_dir, max_len=MAX_LEN, initial_slots=INITIAL_SLOTS)
    slots = [model.alloc_slot() for _ in range(16)]  # grows 4 -> 8 -> 16 rows
    assert model.num_slots == 16 and calls == []
    for slot in slots[:11]:
        model.free_slot(slot)  # 5 live of 16 rows: no shrink yet
    assert model.num_slots == 16 and calls == []
    model.free_slot(slots[11])  # 4 live <= 16 / 4: shrinks to 4 rows
    assert model.num_slots == INITIAL_SLOTS and calls == [1]
    assert host_memory.release_freed_memory() in (True, False)  # the real call runs here too
