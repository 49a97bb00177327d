"""The lean draft forward equals transformers' LlamaForCausalLM (fp32 reference)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from accel_plugin.speculative.llama import LlamaDraftModel
from accel_plugin.speculative.llama_weights import DraftModelError

#: max |logit difference| against transformers, by dtype (fp32: rounding order only)
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 0.15}


@pytest.fixture(scope="module", params=["gqa-d32", "mha-d64", "draft-d32"])
def model_dir(request, tiny_models):
    return tiny_models(request.param)


def hf_logits(model_dir, tokens: list[int], dtype=torch.float32) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = _hf_cache.get((str(model_dir), dtype))
    if model is None:
        model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        _hf_cache[(str(model_dir), dtype)] = model
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


_hf_cache: dict = {}


def run(model, rows: list[list[int]], starts: list[int], slots: list[int]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return model.forward(tokens, torch.tensor(starts), torch.tensor([len(r) for r in rows]), torch.tensor(slots))


def test_ragged_prefill_then_decode_matches_transformers(model_dir):
    """Odd lengths (1, 17, 97) in one padded batch, then steps of 1 and 2 tokens."""
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 384, (n,), generator=gen).tolist() for n in (1, 17, 97, 5)]
    model = LlamaDraftModel(model_dir, max_len=256, initial_slots=2)  # slots grow to 4
    slots = [model.alloc_slot() for _ in seqs]
    logits = run(model, seqs, [0] * 4, slots)
    for i, s in enumerate(seqs):
        assert (logits[i] - hf_logits(model_dir, s)).abs().max() < TOLERANCE[torch.float32]
    for step in range(3):
        new = [torch.randint(0, 384, (1 + (i + step) % 2,), generator=gen).tolist() for i in range(4)]
        logits = run(model, new, [len(s) for s in seqs], slots)
        seqs = [s + n for s, n in zip(seqs, new)]
        for i, s in enumerate(seqs):
            assert (logits[i] - hf_logits(model_dir, s)).abs().max() < TOLERANCE[torch.float32]


def test_rewind_overwrites_rejected_tokens(model_dir):
    """Running from an earlier position drops what was cached after it."""
    model = LlamaDraftModel(model_dir, max_len=64)
    slot = model.alloc_slot()
    run(model, [[5, 6, 7, 8, 9, 10]], [0], [slot])
    logits = run(model, [[11, 12]], [3], [slot])  # tokens 8, 9, 10 were rejected
    assert (logits[0] - hf_logits(model_dir, [5, 6, 7, 11, 12])).abs().max() < TOLERANCE[torch.float32]


def test_rows_in_any_slot_order_and_capacity_growth(model_dir):
    model = LlamaDraftModel(model_dir, max_len=512, initial_slots=3)
    slots = [model.alloc_slot() for _ in range(3)]
    seqs = [[7] * 150, [8, 9], [10] * 40]  # 150 > the initial capacity of 128
    logits = run(model, seqs[::-1], [0, 0, 0], slots[::-1])
    for i, s in enumerate(seqs[::-1]):
        assert (logits[i] - hf_logits(model_dir, s)).abs().max() < TOLERANCE[torch.float32]
    assert model.kv.k_cache[0].shape[2] >= 150


def test_bfloat16_close_to_reference(tiny_models):
    model_dir = tiny_models("gqa-d32")
    model = LlamaDraftModel(model_dir, dtype=torch.bfloat16, max_len=64)
    tokens = list(range(3, 30))
    logits = run(model, [tokens], [0], [model.alloc_slot()])
    assert (logits[0] - hf_logits(model_dir, tokens)).abs().max() < TOLERANCE[torch.bfloat16]


def test_slots_are_reused(tiny_models):
    model = LlamaDraftModel(tiny_models("draft-d32"), max_len=64, initial_slots=2)
    a, b = model.alloc_slot(), model.alloc_slot()
    assert model.num_free_slots == 0
    model.free_slot(a)
    assert model.alloc_slot() == a
    c = model.alloc_slot()  # grows
    assert c not in (a, b) and model.kv.k_cache[0].shape[0] == 4


def test_unsupported_checkpoints_are_refused(tiny_models, tmp_path):
    src = tiny_models("draft-d32")
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftModelError, match="rope type 'dynamic'"):
        LlamaDraftModel(bad)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    cfg["hidden_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftModelError, match="embed_tokens has shape"):
        LlamaDraftModel(bad)


def test_rope_theta_from_config_is_used(tiny_models, tmp_path):
    """A model saved with rope_theta 500000 still matches transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    src = tiny_models("draft-d32")
    config = LlamaConfig.from_pretrained(src)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    torch.manual_seed(3)
    hf = LlamaForCausalLM(config).eval()
    out = tmp_path / "theta"
    hf.save_pretrained(out, safe_serialization=True)
    model = LlamaDraftModel(out, max_len=64)
    tokens = list(range(10, 40))
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0, -1]
    assert (run(model, [tokens], [0], [model.alloc_slot()])[0] - ref).abs().max() < TOLERANCE[torch.float32]


def test_rows_read_in_place_or_gathered_give_the_same_logits(tiny_models):
    """Rows 0..B-1 in order read the cache in place; any other order gathers it."""
    model = LlamaDraftModel(tiny_models("gqa-d32"), max_len=64, initial_slots=4)
    slots = [model.alloc_slot() for _ in range(4)]
    seqs = [list(range(3, 3 + n)) for n in (5, 9, 2, 14)]
    run(model, seqs, [0] * 4, slots)
    nxt = [[40], [41], [42], [43]]
    in_order = run(model, nxt, [len(s) for s in seqs], slots)
    perm = [2, 0, 3, 1]
    gathered = run(model, [nxt[i] for i in perm], [len(seqs[i]) for i in perm], [slots[i] for i in perm])
    for r, i in enumerate(perm):
        assert (gathered[r] - in_order[i]).abs().max() < 1e-5
        assert (in_order[i] - hf_logits(tiny_models("gqa-d32"), seqs[i] + nxt[i])).abs().max() < TOLERANCE[torch.float32]


def record_rows(monkeypatch, model, path: str) -> list[int]:
    """The rows of every product ``model`` runs on its ``path`` ("small" or "large"), as they come."""
    rows: list[int] = []
    product = getattr(model, f"_{path}_linear")

    def counted(x, weight, bias=None):
        rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return product(x, weight, bias)

    monkeypatch.setattr(model, f"_{path}_linear", counted)
    return rows


def test_ragged_rows_run_only_their_real_tokens(tiny_models, monkeypatch):
    """Rows of 3, 1 and 2 new tokens: each row's logits equal the row run alone, and the matrix
    products see the 6 real tokens, not 3 x 3 padded ones."""
    model_dir = tiny_models("gqa-d32")
    model = LlamaDraftModel(model_dir, max_len=64, initial_slots=6)
    alone = LlamaDraftModel(model_dir, max_len=64, initial_slots=6)
    seqs = [list(range(3, 3 + n)) for n in (7, 4, 11)]
    slots = [model.alloc_slot() for _ in seqs]
    for _ in seqs:
        alone.alloc_slot()
    run(model, seqs, [0] * 3, slots)
    rows_seen = record_rows(monkeypatch, model, "large")
    new = [[40, 41, 42], [43], [44, 45]]
    got = run(model, new, [len(s) for s in seqs], slots)
    assert rows_seen and set(rows_seen[:-1]) == {6} and rows_seen[-1] == 3  # the head: each row's last token
    for i, (s, n) in enumerate(zip(seqs, new)):
        run(alone, [s], [0], [i])
        want = run(alone, [n], [len(s)], [i])[0]
        assert (got[i] - want).abs().max() < 1e-5
        assert (got[i] - hf_logits(model_dir, s + n)).abs().max() < TOLERANCE[torch.float32]
    # a step after it sees the K/V the ragged forward wrote at the right positions
    after = run(model, [[50], [51], [52]], [len(s) + len(n) for s, n in zip(seqs, new)], slots)
    for i, (s, n) in enumerate(zip(seqs, new)):
        assert (after[i] - hf_logits(model_dir, s + n + [50 + i])).abs().max() < TOLERANCE[torch.float32]


def test_small_rows_count_real_tokens(tiny_models, monkeypatch):
    """A ragged forward of 3 real tokens padded to 2 x 2 takes the small-rows product (at most 3 rows)."""
    from accel_plugin.speculative import llama

    monkeypatch.setattr(llama, "native_bf16", lambda: False)
    model = LlamaDraftModel(tiny_models("gqa-d32"), max_len=64, initial_slots=2, small_batch_weights=torch.bfloat16,
                            small_batch_rows=3)
    slots = [model.alloc_slot(), model.alloc_slot()]
    run(model, [[3, 4, 5], [6, 7]], [0, 0], slots)  # 5 real tokens > 3: the large path
    small, large = record_rows(monkeypatch, model, "small"), record_rows(monkeypatch, model, "large")
    run(model, [[8, 9], [10]], [3, 2], slots)
    assert len(small) > 0 and len(large) == 0


def test_small_batch_weights_only_for_small_forwards(tiny_models, monkeypatch):
    """Without native bfloat16: float32 compute with bfloat16 weights up to small_batch_rows rows,
    float32 weights beyond."""
    from accel_plugin.speculative import llama

    monkeypatch.setattr(llama, "native_bf16", lambda: False)
    model_dir = tiny_models("gqa-d32")
    plain = LlamaDraftModel(model_dir, max_len=64, initial_slots=4)
    mixed = LlamaDraftModel(model_dir, max_len=64, initial_slots=4, small_batch_weights=torch.bfloat16,
                            small_batch_rows=2)
    assert mixed.dtype == torch.float32 and mixed.kv.dtype == torch.float32
    assert mixed.small_layers[0].qkv.dtype == torch.bfloat16 and mixed.small_lm_head.dtype == torch.bfloat16
    assert mixed.layers[0].qkv.dtype == torch.float32
    assert mixed.forward_bytes_at(2) < mixed.forward_bytes == mixed.forward_bytes_at(3) == plain.forward_bytes
    tokens = [list(range(3, 8)), list(range(9, 12)), list(range(20, 24))]
    for m in (plain, mixed):
        for _ in tokens:
            m.alloc_slot()
    # 12 tokens (3 rows of up to 5) > 2 rows: float32 weights, the same logits as the float32 model
    assert torch.equal(run(mixed, tokens, [0] * 3, [0, 1, 2]), run(plain, tokens, [0] * 3, [0, 1, 2]))
    # 1 row x 1 token: bfloat16 weights, close to the reference, not equal to float32
    small = run(mixed, [[30]], [5], [0])[0]
    exact = run(plain, [[30]], [5], [0])[0]
    assert not torch.equal(small, exact)
    assert (small - hf_logits(model_dir, tokens[0] + [30])).abs().max() < TOLERANCE[torch.bfloat16]


def test_native_bf16_weights_for_every_forward(tiny_models, monkeypatch):
    """With native bfloat16 and the native product: float32 compute, bfloat16 matrices only (no
    float32 copies), the native product up to small_batch_rows rows, torch's bfloat16 one beyond;
    both close to the reference."""
    from accel_plugin.kernels.cpu_linear import SkinnyWeight
    from accel_plugin.speculative import llama

    if llama.native_bf16_product() is None:
        pytest.skip("no native product of bfloat16 matrices here (needs AVX512-BF16 and the native build)")
    monkeypatch.setattr(llama, "native_bf16", lambda: True)
    model_dir = tiny_models("gqa-d32")
    plain = LlamaDraftModel(model_dir, max_len=64, initial_slots=4)
    mixed = LlamaDraftModel(model_dir, max_len=64, initial_slots=4, small_batch_weights=torch.bfloat16,
                            small_batch_rows=2)
    assert mixed.dtype == torch.float32 and mixed.kv.dtype == torch.float32
    assert isinstance(mixed.small_layers[0].qkv, SkinnyWeight) and isinstance(mixed.small_lm_head, SkinnyWeight)
    assert mixed.layers is mixed.large_layers and mixed.large_layers[0].qkv.dtype == torch.bfloat16
    assert mixed.forward_bytes_at(1) == mixed.forward_bytes_at(3) == mixed.forward_bytes < plain.forward_bytes
    tokens = [list(range(3, 8)), list(range(9, 12)), list(range(20, 24))]
    for m in (plain, mixed):
        for _ in tokens:
            m.alloc_slot()
    large = run(mixed, tokens, [0] * 3, [0, 1, 2])  # 12 rows: torch's bfloat16 product
    for i, t in enumerate(tokens):
        assert (large[i] - hf_logits(model_dir, t)).abs().max() < TOLERANCE[torch.bfloat16]
    run(plain, tokens, [0] * 3, [0, 1, 2])
    small = run(mixed, [[30]], [5], [0])[0]  # 1 row: the native product
    exact = run(plain, [[30]], [5], [0])[0]
    assert not torch.equal(small, exact)
    assert (small - hf_logits(model_dir, tokens[0] + [30])).abs().max() < TOLERANCE[torch.bfloat16]
    # the native product rounds the operands only, torch's bfloat16 product its result as well
    monkeypatch.setattr(mixed, "small_batch_rows", 0)
    assert (small - exact).abs().max() <= (run(mixed, [[30]], [5], [0])[0] - exact).abs().max()


def test_resolve_precision(monkeypatch):
    from accel_plugin.speculative import llama

    cpu, bf16, fp32 = torch.device("cpu"), torch.bfloat16, torch.float32
    monkeypatch.setattr(llama, "native_bf16", lambda: False)
    assert llama.resolve_precision(bf16, cpu) == (fp32, bf16)
    assert llama.resolve_precision(fp32, cpu) == (fp32, None)
    assert llama.resolve_precision(torch.float16, cpu) == (torch.float16, None)
    assert llama.resolve_precision(bf16, torch.device("cuda")) == (bf16, None)
    monkeypatch.setattr(llama, "native_bf16", lambda: True)
    monkeypatch.setattr(llama, "native_bf16_product", lambda device="cpu": ("pack", "linear"))
    assert llama.resolve_precision(bf16, cpu) == (fp32, bf16)
    monkeypatch.setattr(llama, "native_bf16_product", lambda device="cpu": None)
    assert llama.resolve_precision(bf16, cpu) == (bf16, None)


def test_large_forwards_use_prepacked_matrices_with_the_same_logits(tiny_models, monkeypatch):
    """Forwards beyond the small rows multiply by oneDNN's prepacked matrices where torch
    has them; the logits stay those of the plain float32 product (rounding order only)."""
    from accel_plugin.speculative import llama

    model_dir = tiny_models("gqa-d32")
    monkeypatch.setattr(llama, "native_bf16", lambda: False)  # the float32 + small bfloat16 layout
    if llama.packed_linear(torch.float32, torch.device("cpu")) is None:
        pytest.skip("this torch has no mkldnn prepacked linear (the plain path serves)")
    packed = LlamaDraftModel(model_dir, max_len=64, initial_slots=4, small_batch_weights=torch.bfloat16,
                             small_batch_rows=2)
    assert packed.large_layers[0].qkv.is_mkldnn and packed.large_lm_head.is_mkldnn
    assert packed.layers is packed.large_layers  # the plain float32 copies are not kept as well
    monkeypatch.setattr(llama, "packed_linear", lambda dtype, device: None)
    plain = LlamaDraftModel(model_dir, max_len=64, initial_slots=4, small_batch_weights=torch.bfloat16,
                            small_batch_rows=2)
    assert not plain.large_layers[0].qkv.is_mkldnn
    tokens = [list(range(3, 8)), list(range(9, 12)), list(range(20, 24))]
    for m in (packed, plain):
        for _ in tokens:
            m.alloc_slot()
    got, want = run(packed, tokens, [0] * 3, [0, 1, 2]), run(plain, tokens, [0] * 3, [0, 1, 2])
    assert (got - want).abs().max() < TOLERANCE[torch.float32]
    for i, t in enumerate(tokens):
        assert (got[i] - hf_logits(model_dir, t)).abs().max() < TOLERANCE[torch.float32]


def test_packed_linear_only_for_float32_on_a_cpu():
    from accel_plugin.speculative import llama

    assert llama.packed_linear(torch.bfloat16, torch.device("cpu")) is None
    assert llama.packed_linear(torch.float32, torch.device("cuda")) is None
