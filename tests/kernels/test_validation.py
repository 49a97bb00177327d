"""Bad input raises ValueError naming the constraint and the value received."""

import pytest
import torch

from accel_plugin.kernels import flash_attn_varlen_func, paged_attention, reference, write_kv_cache

I32 = torch.int32


def varlen_args(**change):
    args = dict(q=torch.zeros(10, 4, 64), k=torch.zeros(12, 2, 64), v=torch.zeros(12, 2, 64),
                cu_seqlens_q=torch.tensor([0, 4, 10], dtype=I32), cu_seqlens_k=torch.tensor([0, 5, 12], dtype=I32),
                max_seqlen_q=6, max_seqlen_k=7)
    args.update(change)
    return args


def paged_args(**change):
    args = dict(q=torch.zeros(5, 4, 64), k_cache=torch.zeros(6, 16, 2, 64), v_cache=torch.zeros(6, 16, 2, 64),
                cu_seqlens_q=torch.tensor([0, 1, 5], dtype=I32), seq_lens=torch.tensor([17, 20], dtype=I32),
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=I32), max_seqlen_q=4, max_seq_len=20)
    args.update(change)
    return args


def write_args(**change):
    args = dict(k=torch.zeros(3, 2, 64), v=torch.zeros(3, 2, 64), k_cache=torch.zeros(4, 16, 2, 64),
                v_cache=torch.zeros(4, 16, 2, 64), slot_mapping=torch.tensor([0, -1, 63]))
    args.update(change)
    return args


VARLEN_CASES = {
    "q 2-D": (dict(q=torch.zeros(10, 64)), "q must be a 3-D tensor [total_q, num_heads, head_dim]; got shape (10, 64)"),
    "k/v shape": (dict(v=torch.zeros(11, 2, 64)), "k and v must have the same shape"),
    "head_dim": (dict(q=torch.zeros(10, 4, 72), k=torch.zeros(12, 2, 72), v=torch.zeros(12, 2, 72)),
                 "head_dim must be one of 32, 64, 80, 96, 128, 256; got 72"),
    "dtype": (dict(q=torch.zeros(10, 4, 64, dtype=torch.int32)), "q.dtype must be one of float16, bfloat16, "
              "float32"),
    "mixed dtypes": (dict(k=torch.zeros(12, 2, 64, dtype=torch.float16)), "k.dtype must equal q.dtype"),
    "head ratio": (dict(q=torch.zeros(10, 3, 64)), "num_heads must be a multiple of num_kv_heads (MHA, GQA or MQA); "
                   "got num_heads=3, num_kv_heads=2"),
    "contiguity": (dict(q=torch.zeros(10, 4, 128)[:, :, ::2]), "q must have a contiguous last dimension"),
    "cu dtype": (dict(cu_seqlens_q=torch.tensor([0, 4, 10])),
                 "cu_seqlens_q must have dtype torch.int32; got torch.int64"),
    "cu length": (dict(cu_seqlens_k=torch.tensor([0, 12], dtype=I32)), "cu_seqlens_k must have length 3"),
    "cu start": (dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=I32)), "cu_seqlens_q[0] must be 0; got 1"),
    "cu order": (dict(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=I32)), "cu_seqlens_q must be non-decreasing"),
    "cu past end": (dict(cu_seqlens_k=torch.tensor([0, 5, 13], dtype=I32)),
                    "cu_seqlens_k[-1] (13) must be <= k.shape[0] (12)"),
    "max_seqlen": (dict(max_seqlen_q=5), "max_seqlen_q (5) must be >= the longest sequence in cu_seqlens_q (6)"),
    "max_seqlen type": (dict(max_seqlen_k=7.0), "max_seqlen_k must be an int; got float"),
    "window": (dict(window_size=(-2, 0)), "window_size entries must be >= -1"),
    "window type": (dict(window_size=5), "window_size must be a pair of ints"),
    "softcap": (dict(softcap=-1.0), "softcap must be a finite float >= 0"),
    "scale": (dict(softmax_scale=0.0), "softmax_scale must be a positive finite float"),
    "out shape": (dict(out=torch.zeros(9, 4, 64)), "out must have the shape of q (10, 4, 64); got (9, 4, 64)"),
    "not a tensor": (dict(q=[[1.0]]), "q must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", VARLEN_CASES)
@pytest.mark.parametrize("fn", [flash_attn_varlen_func, reference.flash_attn_varlen_func], ids=["kernel", "ref"])
def test_varlen_errors(fn, case):
    change, message = VARLEN_CASES[case]
    with pytest.raises(ValueError) as info:
        fn(**varlen_args(**change))
    assert message in str(info.value)


PAGED_CASES = {
    "cache 3-D": (dict(k_cache=torch.zeros(6, 16, 128)), "k_cache must be a 4-D tensor [num_blocks, block_size, "
                  "num_kv_heads, head_dim]"),
    "cache shapes": (dict(v_cache=torch.zeros(7, 16, 2, 64)), "k_cache and v_cache must have the same shape"),
    "block size": (dict(k_cache=torch.zeros(6, 8, 2, 64), v_cache=torch.zeros(6, 8, 2, 64)),
                   "block_size (k_cache.shape[1]) must be in [16, 256]; got 8"),
    "cache dtype": (dict(k_cache=torch.zeros(6, 16, 2, 64, dtype=torch.float16)), "k_cache.dtype must equal q.dtype"),
    "head ratio": (dict(k_cache=torch.zeros(6, 16, 3, 64), v_cache=torch.zeros(6, 16, 3, 64)),
                   "got num_heads=4, num_kv_heads=3"),
    "seq_lens dtype": (dict(seq_lens=torch.tensor([17, 20])), "seq_lens must have dtype torch.int32"),
    "cu length": (dict(cu_seqlens_q=torch.tensor([0, 5], dtype=I32)), "cu_seqlens_q must have length 3"),
    "table rows": (dict(block_table=torch.zeros(3, 2, dtype=I32)), "block_table.shape[0] must equal len(seq_lens) (2)"),
    "table dtype": (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), "block_table must have dtype torch.int32"),
    "short context": (dict(seq_lens=torch.tensor([17, 3], dtype=I32)), "seq_lens[1] (3) must be >= that sequence's "
                      "query length (4)"),
    "capacity": (dict(seq_lens=torch.tensor([17, 33], dtype=I32), max_seq_len=40), "exceeds block_table capacity"),
    "max_seq_len": (dict(max_seq_len=19), "max_seq_len (19) must be >= max(seq_lens) (20)"),
    "block index": (dict(block_table=torch.tensor([[0, 1], [2, 6]], dtype=I32)), "block_table entries in use must be "
                    "in [0, num_blocks=6)"),
    "num_splits": (dict(num_splits=-1), "num_splits must be >= 0; got -1"),
    "out dtype": (dict(out=torch.zeros(5, 4, 64, dtype=torch.float16)), "out.dtype must equal q.dtype"),
}


@pytest.mark.parametrize("case", PAGED_CASES)
@pytest.mark.parametrize("fn", [paged_attention, reference.paged_attention], ids=["kernel", "ref"])
def test_paged_errors(fn, case):
    change, message = PAGED_CASES[case]
    with pytest.raises(ValueError) as info:
        fn(**paged_args(**change))
    assert message in str(info.value)


def test_unused_block_table_entries_are_not_checked():
    paged_attention(**paged_args(block_table=torch.tensor([[0, 1, 99], [2, 3, -5]], dtype=I32)))


WRITE_CASES = {
    "k/v shape": (dict(v=torch.zeros(3, 2, 32)), "k and v must have the same shape"),
    "cache heads": (dict(k_cache=torch.zeros(4, 16, 1, 64), v_cache=torch.zeros(4, 16, 1, 64)),
                    "k_cache.shape[2] (num_kv_heads) must be 2; got 1"),
    "cache dtype": (dict(k_cache=torch.zeros(4, 16, 2, 64, dtype=torch.float16),
                         v_cache=torch.zeros(4, 16, 2, 64, dtype=torch.float16)), "k.dtype must equal k_cache.dtype"),
    "slot length": (dict(slot_mapping=torch.tensor([0, 1])), "slot_mapping must have length 3"),
    "slot dtype": (dict(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), "slot_mapping must have dtype torch.int64 or "
                   "torch.int32"),
    "slot range": (dict(slot_mapping=torch.tensor([0, 64, 1])), "slot_mapping entries must be -1 (skip) or in [0, "
                   "num_blocks x block_size = 64)"),
    "k contiguity": (dict(k=torch.zeros(3, 2, 128)[:, :, ::2]), "k must have a contiguous last dimension"),
}


@pytest.mark.parametrize("case", WRITE_CASES)
@pytest.mark.parametrize("fn", [write_kv_cache, reference.write_kv_cache], ids=["kernel", "ref"])
def test_write_errors(fn, case):
    change, message = WRITE_CASES[case]
    with pytest.raises(ValueError) as info:
        fn(**write_args(**change))
    assert message in str(info.value)


def test_device_mismatch_names_both_devices():
    with pytest.raises(ValueError, match="q is on cpu, k on meta"):
        flash_attn_varlen_func(**varlen_args(k=torch.zeros(12, 2, 64, device="meta")))


def test_messages_hold_no_tensor_contents():
    with pytest.raises(ValueError) as info:
        paged_attention(**paged_args(block_table=torch.tensor([[0, 1], [2, 60]], dtype=I32)))
    assert "tensor(" not in str(info.value)


def test_kernels_refuse_float64_but_the_reference_accepts_it():
    args = varlen_args(q=torch.zeros(10, 4, 64, dtype=torch.float64), k=torch.zeros(12, 2, 64, dtype=torch.float64),
                       v=torch.zeros(12, 2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="q.dtype must be one of float16, bfloat16, float32; got torch.float64"):
        flash_attn_varlen_func(**args)
    assert reference.flash_attn_varlen_func(**args).dtype == torch.float64


def test_lengths_accept_integer_like_values():
    import numpy as np

    out = flash_attn_varlen_func(**varlen_args(max_seqlen_q=np.int64(6), max_seqlen_k=torch.tensor(7)))
    assert out.shape == (10, 4, 64)


@pytest.mark.parametrize("value", ["no", None, 1])
def test_boolean_switches_must_be_bools(value):
    with pytest.raises(ValueError, match=f"causal must be True or False; got {value!r}"):
        flash_attn_varlen_func(**varlen_args(causal=value))
    with pytest.raises(ValueError, match=f"return_lse must be True or False; got {value!r}"):
        flash_attn_varlen_func(**varlen_args(return_lse=value))
    with pytest.raises(ValueError, match=f"causal must be True or False; got {value!r}"):
        paged_attention(**paged_args(causal=value))
