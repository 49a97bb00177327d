"""The CPU paths (kernels/cpu_attention.py: native kernels and torch) against the float64 reference.

Every paged case runs twice: the native C++ kernels (kernels/cpu_native.py, for queries of at
most NATIVE_MAX_Q rows per sequence) and the torch path (``native_disabled``); both by the
kernels' rule.

Property tests over the kernels' shape space (GQA ratios, head sizes, windows, softcap,
block sizes, empty sequences, spec-verify and chunked prefill), plus fixed long cases
(to 4k tokens), vLLM's combined K|V cache layout, a step's plan shared by its layers,
the KV write, and the public functions' dispatch to this path. CPU tensors always,
whatever TRITON_INTERPRET says: the path is called directly.

The native kernels (kernels/cpu_native.py, csrc/cpu_attention.cpp) also on their own, called
as the framework path calls them (the op, no Python validation): they build here (g++ and
ninja are part of the set-up; a CI run without them would pass on the slower torch path
unnoticed), match the reference over the whole head-size table and query lengths up to
NATIVE_MAX_Q, and check every argument they rely on (a bad block id, slot, length or shape
raises naming it, and nothing is written).
"""

import contextlib
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_plugin.kernels import _runtime, cpu_attention, cpu_native, limits, reference, tolerance
from accel_plugin.kernels._validation import SUPPORTED_DTYPES, validate_paged, validate_varlen

SETTINGS = settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
HEADS = st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4), (9, 3), (8, 1)])
WINDOW = st.tuples(st.integers(-1, 40), st.integers(-1, 40))
DTYPE = st.sampled_from(SUPPORTED_DTYPES)
LOWP = tolerance.TorchLowp()


def randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


def cu_seqlens(lens):
    return torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)


def poison_unwritten(caches, table, seq_lens, block_size):
    """NaN in every slot no sequence wrote, as an uninitialised cache (TGI's torch.empty) may hold:
    a masked key must not reach the output through 0 * NaN."""
    written = torch.zeros(caches[0].shape[:2], dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        written[table[b, pos // block_size].long(), pos % block_size] = True
    for cache in caches:
        cache[~written] = float("nan")


def paged_inputs(gen, q_lens, seq_lens, heads, head_dim, block_size, dtype, pad_rows=0, combined=False):
    """Shuffled blocks, a foreign block after each sequence's last (reading past seq_len shows),
    NaN in every slot past a sequence's length."""
    num_heads, num_kv_heads = heads
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(used) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(seq_lens), max(used) + 1), int(perm[-1]), dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = perm[start:start + n]
        start += n
    if combined:  # vLLM's layout: each block [block_size, Hkv, K|V]
        kv = randn(gen, num_blocks, block_size, num_kv_heads, 2 * head_dim, dtype=dtype)
        k_cache, v_cache = kv[..., :head_dim], kv[..., head_dim:]
    else:
        k_cache = randn(gen, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
        v_cache = randn(gen, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    poison_unwritten((kv,) if combined else (k_cache, v_cache), table, seq_lens, block_size)
    q = randn(gen, sum(q_lens) + pad_rows, num_heads, head_dim, dtype=dtype)
    return q, k_cache, v_cache, cu_seqlens(q_lens), torch.tensor(seq_lens, dtype=torch.int32), table


def assert_close(out, ref, lowp, dtype, max_score):
    err, limit, torch_err = tolerance.verdict(out, ref, lowp, dtype, max_score)
    assert err <= limit, f"max error {err:.3g} > {limit:.3g} (torch's own {dtype} error {torch_err:.3g})"


def run_paged(q, k_cache, v_cache, cu, lens, table, causal, window, softcap, out=None, plans=None):
    params = validate_paged(q, k_cache, v_cache, cu, lens, table, int((cu[1:] - cu[:-1]).max()), int(lens.max()),
                            None, window, softcap, 0, out, SUPPORTED_DTYPES, check_contents=True)
    return cpu_attention.run_paged(q, k_cache, v_cache, cu, lens, table, params, causal, out, plans)


def check_paged(q, k_cache, v_cache, cu, lens, table, causal, window, softcap, dtype):
    """Both CPU paths, the native kernels (where they serve: short queries) and the torch path."""
    n = int(cu[-1])
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    args = (cu, lens, table, int((cu[1:] - cu[:-1]).max()), int(lens.max()))
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), *args, **opts)
    lowp = LOWP.paged(q, k_cache, v_cache, cu, lens, table, **opts)
    score = tolerance.max_score(q, k_cache.nan_to_num(0.0), softcap=softcap)
    for path in (contextlib.nullcontext(), cpu_attention.native_disabled()):
        out = torch.full_like(q, 7.0)
        with path:
            run_paged(q, k_cache, v_cache, cu, lens, table, causal, window, softcap, out=out)
        assert (out[n:] == 7.0).all(), "padding rows must stay untouched"
        assert_close(out[:n], ref[:n], lowp[:n], dtype, score)


@st.composite
def paged_case(draw):
    batch = draw(st.integers(1, 6))
    q_lens = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    context = draw(st.lists(st.integers(0, 150), min_size=batch, max_size=batch))
    return dict(q_lens=q_lens, seq_lens=[q + c for q, c in zip(q_lens, context, strict=True)], heads=draw(HEADS),
                head_dim=draw(st.sampled_from([32, 64, 80])), block_size=draw(st.sampled_from([16, 32, 48, 256])),
                causal=draw(st.booleans()), window=draw(WINDOW), softcap=draw(st.sampled_from([0.0, 3.0])),
                dtype=draw(DTYPE), pad_rows=draw(st.integers(0, 2)), combined=draw(st.booleans()))


@SETTINGS
@given(case=paged_case())
def test_paged_matches_reference(case):
    if max(case["q_lens"]) == 0:
        case["q_lens"][0] = 1
        case["seq_lens"][0] = max(1, case["seq_lens"][0])
    gen = torch.Generator().manual_seed(0)
    inputs = paged_inputs(gen, case["q_lens"], case["seq_lens"], case["heads"], case["head_dim"],
                          case["block_size"], case["dtype"], case["pad_rows"], case["combined"])
    check_paged(*inputs, case["causal"], case["window"], case["softcap"], case["dtype"])


@st.composite
def varlen_case(draw):
    batch = draw(st.integers(1, 4))
    q_lens = draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    same = draw(st.booleans())  # fresh prompts: k_len == q_len (SDPA's own causal mask)
    k_lens = q_lens if same else draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    return dict(q_lens=q_lens, k_lens=k_lens, heads=draw(HEADS), head_dim=draw(st.sampled_from([32, 64, 96])),
                causal=draw(st.booleans()), window=draw(st.sampled_from([(-1, -1), (5, -1), (8, 3), (0, 0)])),
                softcap=draw(st.sampled_from([0.0, 3.0])), return_lse=draw(st.booleans()), dtype=draw(DTYPE),
                pad_rows=draw(st.integers(0, 2)))


def check_varlen(gen, q_lens, k_lens, heads, head_dim, causal, window, softcap, return_lse, dtype, pad_rows=0):
    q = randn(gen, sum(q_lens) + pad_rows, heads[0], head_dim, dtype=dtype)
    k = randn(gen, sum(k_lens), heads[1], head_dim, dtype=dtype)
    v = randn(gen, sum(k_lens), heads[1], head_dim, dtype=dtype)
    cu_q, cu_k = cu_seqlens(q_lens), cu_seqlens(k_lens)
    params = validate_varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), None, window, softcap, None,
                             SUPPORTED_DTYPES, check_contents=True)
    got = cpu_attention.run_varlen(q, k, v, cu_q, cu_k, params, causal, return_lse)
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    ref, ref_lse = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu_q, cu_k, max(q_lens),
                                                    max(k_lens), return_lse=True, **opts)
    lowp = LOWP.varlen(q, k, v, cu_q, cu_k, **opts)
    score = tolerance.max_score(q, k, softcap=softcap)
    out = got[0] if return_lse else got
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, ref, lowp, dtype, score)
    if return_lse:
        lse = got[1]
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ"
        if finite.any():
            assert tolerance.max_err(lse[finite], ref_lse[finite]) <= tolerance.lse_limit(ref_lse[finite], score)


@SETTINGS
@given(case=varlen_case())
def test_varlen_matches_reference(case):
    check_varlen(torch.Generator().manual_seed(1), **case)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
def test_long_prefill_and_decode_to_4k(dtype):
    """A 4k prompt (one sequence: views, SDPA's causal mask) and decode over 4k contexts."""
    gen = torch.Generator().manual_seed(2)
    check_varlen(gen, [4096], [4096], (4, 2), 64, True, (-1, -1), 0.0, False, dtype)
    check_varlen(gen, [1000, 3], [1000, 3], (2, 1), 64, True, (255, -1), 0.0, False, dtype)
    inputs = paged_inputs(gen, [1, 1, 4], [4096, 17, 2000], (4, 2), 64, 32, dtype, combined=True)
    check_paged(*inputs, True, (-1, -1), 0.0, dtype)


def test_decode_batch_of_smollm2_shapes_with_sliding_window_and_softcap():
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 300, (64,), generator=gen).tolist()
    for window, softcap in (((-1, -1), 0.0), ((63, 0), 0.0), ((-1, -1), 30.0)):
        inputs = paged_inputs(gen, [1] * 64, lens, (9, 3), 64, 32, torch.float32, combined=True)
        check_paged(*inputs, True, window, softcap, torch.float32)


def test_empty_sequences_are_skipped_and_empty_rows_are_zero():
    gen = torch.Generator().manual_seed(4)
    inputs = paged_inputs(gen, [0, 3, 0], [5, 40, 0 + 16], (4, 1), 32, 16, torch.float32)
    check_paged(*inputs, True, (-1, -1), 0.0, torch.float32)
    # causal, k_len < q_len: the first rows see no key -> 0 and lse -inf
    check_varlen(gen, [6, 0, 2], [2, 3, 0], (2, 2), 32, True, (-1, -1), 0.0, True, torch.float32)


@cpu_attention.native_disabled()
def test_one_plan_serves_every_layer_of_a_step():
    gen = torch.Generator().manual_seed(5)
    plans = {}
    _, _, _, cu, lens, table = paged_inputs(gen, [1, 2, 1], [33, 70, 5], (9, 3), 64, 32, torch.float32)
    for layer in range(3):  # the step's metadata, each layer's own queries and cache
        q, k_cache, v_cache, *_ = paged_inputs(gen, [1, 2, 1], [33, 70, 5], (9, 3), 64, 32, torch.float32)
        k_cache, v_cache = k_cache.nan_to_num(0.5), v_cache.nan_to_num(0.5)  # written by another table
        poison_unwritten((k_cache, v_cache), table, lens.tolist(), 32)
        got = run_paged(q, k_cache, v_cache, cu, lens, table, True, (-1, -1), 0.0, plans=plans)
        ref = reference.paged_attention(q, k_cache, v_cache, cu, lens, table, 2, 70)
        torch.testing.assert_close(got, ref)
        assert len(plans) == 1, plans.keys()  # built by the first layer, reused by the others
    run_paged(q, k_cache, v_cache, cu, lens, table, True, (15, 0), 0.0, plans=plans)
    assert len(plans) == 2  # another window (e.g. a sliding-window layer): its own plan


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("combined", [False, True])
def test_write_kv_cache_matches_reference(combined, native):
    gen = torch.Generator().manual_seed(6)
    if combined:
        kv = torch.zeros(4, 16, 2, 64)
        k_cache, v_cache = kv[..., :32], kv[..., 32:]
    else:
        k_cache, v_cache = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    k, v = randn(gen, 6, 2, 32, dtype=torch.float32), randn(gen, 6, 2, 32, dtype=torch.float32)
    slots = torch.tensor([3, 17, -1, 63, 0, -1])
    ref_k, ref_v = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    reference.write_kv_cache(k, v, ref_k, ref_v, slots)
    with contextlib.nullcontext() if native else cpu_attention.native_disabled():
        cpu_attention.write_kv_cache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_public_kernels_dispatch_here_where_triton_cannot_run(monkeypatch):
    from accel_plugin import kernels

    monkeypatch.setattr(_runtime, "runtime_mode", lambda device: _runtime.TORCH)
    monkeypatch.setattr(_runtime, "_warned", True)
    calls = []
    for name in ("run_paged", "run_varlen"):
        original = getattr(cpu_attention, name)
        monkeypatch.setattr(cpu_attention, name, lambda *a, _o=original, _n=name, **kw: calls.append(_n) or _o(*a, **kw))
    gen = torch.Generator().manual_seed(7)
    q, k_cache, v_cache, cu, lens, table = paged_inputs(gen, [1, 3], [20, 40], (4, 2), 32, 16, torch.float32)
    out = kernels.paged_attention(q, k_cache, v_cache, cu, lens, table, 3, 40)
    torch.testing.assert_close(out, reference.paged_attention(q, k_cache, v_cache, cu, lens, table, 3, 40))
    kernels.flash_attn_varlen_func(q, q[:, :2], q[:, :2], cu, cu, 3, 3, causal=True)
    assert calls == ["run_paged", "run_varlen"]
    assert cpu_attention.NAME in _runtime.runtime_mode_reason("cpu")


# The native kernels on their own.

NATIVE_SETTINGS = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def ops():
    ops = cpu_native.load()
    assert ops is not None, f"the native CPU kernels did not build here: {cpu_native.status()[1]}"
    return ops


def test_native_kernels_build_here_and_name_themselves(ops):
    available, text = cpu_native.status()
    assert available and cpu_native.NAME in text and str(cpu_native.build_dir()) in text
    name = cpu_native.extension_name()
    assert name.startswith("accel_cpu_") and torch.__version__.split("+")[0].replace(".", "_") in name
    assert cpu_native.NAME in cpu_attention.path_name()


def call_native(ops, q, k_cache, v_cache, cu, lens, table, causal, window, softcap, out=None):
    out = torch.full_like(q, 7.0) if out is None else out
    ops.paged_attention(out, q, k_cache, v_cache, cu, lens, table, q.shape[2] ** -0.5, softcap, window[0],
                        0 if causal else window[1])
    return out


def check_native(ops, q, k_cache, v_cache, cu, lens, table, causal, window, softcap, dtype):
    out = call_native(ops, q, k_cache, v_cache, cu, lens, table, causal, window, softcap)
    n = int(cu[-1])
    assert (out[n:] == 7.0).all(), "rows past cu_seqlens_q[-1] must stay untouched"
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    args = (cu, lens, table, int((cu[1:] - cu[:-1]).max()), int(lens.max()))
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), *args, **opts)
    lowp = LOWP.paged(q, k_cache, v_cache, cu, lens, table, **opts)
    assert_close(out[:n], ref[:n], lowp[:n], dtype, tolerance.max_score(q, k_cache.nan_to_num(0.0), softcap=softcap))


@st.composite
def native_case(draw):
    batch = draw(st.integers(1, 5))
    q_lens = draw(st.lists(st.integers(0, cpu_attention.NATIVE_MAX_Q // 16), min_size=batch, max_size=batch))
    q_lens[0] = max(1, q_lens[0])
    context = draw(st.lists(st.integers(0, 300), min_size=batch, max_size=batch))
    return dict(q_lens=q_lens, seq_lens=[q + c for q, c in zip(q_lens, context, strict=True)],
                heads=draw(st.sampled_from([(1, 1), (2, 1), (4, 2), (9, 3), (8, 1), (16, 2)])),
                head_dim=draw(st.sampled_from(limits.HEAD_SIZES)), block_size=draw(st.sampled_from([16, 32, 48, 256])),
                causal=draw(st.booleans()), window=draw(st.tuples(st.integers(-1, 70), st.integers(-1, 70))),
                softcap=draw(st.sampled_from([0.0, 5.0])), dtype=draw(st.sampled_from([torch.float32, torch.bfloat16,
                                                                                       torch.float16])),
                pad_rows=draw(st.integers(0, 2)), combined=draw(st.booleans()))


@NATIVE_SETTINGS
@given(case=native_case())
def test_native_paged_matches_reference(ops, case):
    gen = torch.Generator().manual_seed(0)
    inputs = paged_inputs(gen, case["q_lens"], case["seq_lens"], case["heads"], case["head_dim"], case["block_size"],
                          case["dtype"], case["pad_rows"], case["combined"])
    check_native(ops, *inputs, case["causal"], case["window"], case["softcap"], case["dtype"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_long_contexts_and_the_longest_native_queries(ops, dtype):
    gen = torch.Generator().manual_seed(1)
    inputs = paged_inputs(gen, [1, 1, 3], [4096, 17, 2000], (4, 2), 64, 32, dtype, combined=True)
    check_native(ops, *inputs, True, (-1, -1), 0.0, dtype)
    q_max = cpu_attention.NATIVE_MAX_Q
    inputs = paged_inputs(gen, [q_max, 0, 1], [q_max + 100, 0, 7], (9, 3), 64, 32, dtype, combined=True)
    check_native(ops, *inputs, True, (-1, -1), 0.0, dtype)


def _bad_calls(q, k_cache, v_cache, cu, lens, table):
    """(what is wrong, arguments) pairs; each must raise naming the argument."""
    big = table.clone()
    big[0, 0] = k_cache.shape[0]
    negative = table.clone()
    negative[1, 0] = -3
    return [
        ("block_table[0, 0]", (q, k_cache, v_cache, cu, lens, big)),
        ("block_table[1, 0]", (q, k_cache, v_cache, cu, lens, negative)),
        ("seq_lens[1]", (q, k_cache, v_cache, cu, torch.tensor([40, 1], dtype=torch.int32), table)),
        ("needs", (q, k_cache, v_cache, cu, torch.tensor([40, 10_000], dtype=torch.int32), table)),
        ("cu_seqlens_q", (q, k_cache, v_cache, torch.tensor([0, 3, 99], dtype=torch.int32), lens, table)),
        ("non-decreasing", (q, k_cache, v_cache, torch.tensor([0, 3, 2], dtype=torch.int32), lens, table)),
        ("int32", (q, k_cache, v_cache, cu.long(), lens, table)),
        ("multiple of num_kv_heads", (q[:, :3], k_cache, v_cache, cu, lens, table)),
        ("one dtype", (q.double(), k_cache, v_cache, cu, lens, table)),
        ("head_dim", (q[..., :16].contiguous(), k_cache, v_cache, cu, lens, table)),
    ]


def test_native_bad_arguments_raise_naming_them_and_write_nothing(ops):
    gen = torch.Generator().manual_seed(3)
    inputs = paged_inputs(gen, [2, 3], [40, 9], (4, 2), 32, 16, torch.float32)
    for expected, args in _bad_calls(*inputs):
        out = torch.full_like(args[0], 7.0)
        with pytest.raises(RuntimeError, match=re.escape(expected)):
            ops.paged_attention(out, *args, 0.2, 0.0, -1, 0)
        assert (out == 7.0).all(), expected


def test_native_write_checks_every_slot_and_writes_nothing_on_a_bad_one(ops):
    gen = torch.Generator().manual_seed(4)
    k_cache, v_cache = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    k, v = randn(gen, 3, 2, 32, dtype=torch.float32), randn(gen, 3, 2, 32, dtype=torch.float32)
    for slots, expected in ((torch.tensor([3, 64, 1]), r"slot_mapping\[1\] = 64"),
                            (torch.tensor([3, -2, 1]), r"slot_mapping\[1\] = -2"),
                            (torch.tensor([3, 1]), "num_tokens")):
        with pytest.raises(RuntimeError, match=expected):
            ops.write_kv_cache(k, v, k_cache, v_cache, slots)
        assert not k_cache.any() and not v_cache.any()
    with pytest.raises(RuntimeError, match="one dtype"):
        ops.write_kv_cache(k.half(), v.half(), k_cache, v_cache, torch.tensor([0, 1, 2]))


def test_long_queries_take_the_torch_path(ops, monkeypatch):
    """Past NATIVE_MAX_Q the torch path's SDPA (blocked matmuls) serves: its plan shows."""
    gen = torch.Generator().manual_seed(5)
    monkeypatch.setattr(cpu_attention, "NATIVE_MAX_Q", 4)
    from accel_plugin.kernels._validation import SUPPORTED_DTYPES, validate_paged

    for q_len, planned in ((4, False), (5, True)):
        q, k_cache, v_cache, cu, lens, table = paged_inputs(gen, [q_len], [q_len + 20], (4, 2), 32, 16, torch.float32)
        params = validate_paged(q, k_cache, v_cache, cu, lens, table, q_len, q_len + 20, None, (-1, -1), 0.0, 0,
                                None, SUPPORTED_DTYPES, check_contents=True)
        plans = {}
        cpu_attention.run_paged(q, k_cache, v_cache, cu, lens, table, params, True, None, plans)
        assert any(isinstance(key, tuple) for key in plans) == planned, plans.keys()


def test_a_failed_native_build_warns_once_and_the_torch_path_serves(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setattr(cpu_native, "_build_in_child", lambda: "the build failed (exit 1): g++: not found")
    with pytest.warns(RuntimeWarning, match="g\\+\\+: not found"):
        assert cpu_native.load() is None
    assert cpu_native.status() == (False, "not available: the build failed (exit 1): g++: not found")
    assert cpu_attention.path_name() == cpu_attention.NAME
    gen = torch.Generator().manual_seed(6)
    q, k_cache, v_cache, cu, lens, table = paged_inputs(gen, [1, 2], [30, 9], (4, 2), 32, 16, torch.float32)
    cpu_attention.write_kv_cache(q[:3, :2], q[:3, :2], k_cache, v_cache, torch.tensor([0, 1, 2]))  # index_copy
    assert torch.equal(k_cache[0, :3], q[:3, :2])
