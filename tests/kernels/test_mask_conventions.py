"""The mask conventions, checked against an oracle that shares nothing with the kernels.

The kernels, their float64 reference and the tolerance yardstick all build their mask
with ``reference.attention_mask``; a wrong convention there would pass every other
kernel test. Here each row of a table states a case in the words of vLLM and
flash-attn, the mask is written out by hand, key by key, from those words, and the
answer comes from ``torch.nn.functional.scaled_dot_product_attention`` with that
explicit boolean mask (softcap rows: scores computed by hand in float64,
``cap * tanh(s / cap)`` before masking, as flash-attn and vLLM apply it).

The conventions (flash-attn >= 2.1, which vLLM follows):

* positions are absolute: a sequence holds ``k_len`` tokens and this step's
  ``q_len`` queries are its last ones (bottom-right alignment), so query ``i`` sits
  at position ``k_len - q_len + i``; in chunked prefill and decode the first
  ``k_len - q_len`` tokens are the cached context;
* causal: a query sees the keys at its own position and before;
* ``window_size=(left, right)``: a query at position ``p`` sees the keys at
  ``p - left`` .. ``p + right`` (-1 = unbounded on that side); causal sets ``right`` to 0;
* vLLM's ``sliding_window=W`` is a window of ``W`` tokens *including the query
  itself*: ``window_size=(W - 1, 0)`` (``accel_plugin.attention`` converts it);
* a query that sees no key (more queries than keys, causal) gets 0.

Each row runs through the float64 reference and the Triton kernels (the interpreter
on CPU, compiled on a GPU), varlen and paged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from accel_plugin import kernels
from accel_plugin.attention import PagedAttention
from accel_plugin.kernels import reference

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 32, 16


class Row(NamedTuple):
    q_len: int
    k_len: int  #: the whole context, this step's queries included
    causal: bool
    window: tuple[int, int]  #: flash-attn's (left, right)
    softcap: float = 0.0
    score_scale: float = 1.0  #: multiplies q, so that softcap rows have scores beyond the cap


def sliding(w: int) -> tuple[int, int]:
    """vLLM's sliding_window=w: w tokens including the query itself."""
    return (w - 1, 0)


TABLE = {
    "prefill-causal": Row(13, 13, True, (-1, -1)),
    "prefill-full": Row(9, 9, False, (-1, -1)),
    "chunked-prefill-causal": Row(7, 29, True, (-1, -1)),
    "decode-causal": Row(1, 37, True, (-1, -1)),
    "verify-causal": Row(4, 23, True, (-1, -1)),  # speculative verification: k + 1 queries
    "cross-noncausal": Row(5, 21, False, (-1, -1)),
    "sliding-prefill": Row(19, 19, True, sliding(5)),
    "sliding-chunked": Row(6, 30, True, sliding(8)),
    "sliding-decode": Row(1, 40, True, sliding(16)),
    "sliding-one-token": Row(3, 20, True, sliding(1)),  # sees only itself
    "window-both-sides": Row(17, 17, False, (3, 2)),
    "window-right-only": Row(11, 11, False, (-1, 3)),
    "window-chunked-both-sides": Row(4, 26, False, (6, 9)),
    "causal-ignores-right": Row(8, 20, True, (2, 5)),  # causal sets right to 0
    "softcap-causal": Row(15, 15, True, (-1, -1), softcap=2.0, score_scale=4.0),
    "softcap-sliding-chunked": Row(5, 33, True, sliding(9), softcap=1.5, score_scale=4.0),
    "softcap-decode": Row(1, 24, True, (-1, -1), softcap=30.0, score_scale=6.0),
}
#: more queries than keys only exists for varlen (paged seq_lens count the queries)
VARLEN_ONLY = {"more-queries-than-keys": Row(9, 5, True, (-1, -1))}


def expected_mask(row: Row) -> torch.Tensor:
    """bool [q_len, k_len], key by key from the conventions in the module docstring."""
    left, right = row.window
    if row.causal:
        right = 0
    mask = torch.zeros(row.q_len, row.k_len, dtype=torch.bool)
    for i in range(row.q_len):
        position = row.k_len - row.q_len + i
        for key in range(row.k_len):
            after = key - position  # > 0: a key after the query
            mask[i, key] = (right == -1 or after <= right) and (left == -1 or -after <= left)
    return mask


def oracle(q, k, v, row: Row, scale: float) -> torch.Tensor:
    """[q_len, H, D] float64: SDPA on the explicit mask, or softcapped scores by hand."""
    q, k, v = q.double(), k.double(), v.double()
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = expected_mask(row)
    seen = mask.any(dim=1)
    q_h, k_h, v_h = (t.transpose(0, 1) for t in (q, k, v))  # [H, len, D]
    if row.softcap:
        s = (q_h @ k_h.transpose(1, 2)) * scale
        s = row.softcap * torch.tanh(s / row.softcap)
        s = s.masked_fill(~mask, -math.inf)
        out = torch.softmax(s[:, seen], dim=-1) @ v_h
    else:
        out = F.scaled_dot_product_attention(q_h[:, seen], k_h, v_h, attn_mask=mask[seen], scale=scale)
    full = torch.zeros(NUM_HEADS, row.q_len, HEAD_DIM, dtype=torch.float64)
    full[:, seen] = out
    return full.transpose(0, 1)


def make_inputs(row: Row, dtype):
    gen = torch.Generator().manual_seed(row.q_len * 1000 + row.k_len)
    q = torch.randn(row.q_len, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64) * row.score_scale
    k = torch.randn(row.k_len, NUM_KV_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(row.k_len, NUM_KV_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def to_paged(k, v):
    """(k_cache, v_cache, block_table): the sequence's tokens in reversed blocks, one spare."""
    used = -(-k.shape[0] // BLOCK_SIZE)
    num_blocks = used + 1
    table = torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32)[None, :used]  # reversed, block 0 spare
    k_cache = torch.full((num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), 1e4, dtype=k.dtype, device=k.device)
    v_cache = torch.full_like(k_cache, 1e4)  # a read past seq_len would show
    for token in range(k.shape[0]):
        block, offset = int(table[0, token // BLOCK_SIZE]), token % BLOCK_SIZE
        k_cache[block, offset], v_cache[block, offset] = k[token], v[token]
    return k_cache, v_cache, table.to(k.device)


def varlen(module, q, k, v, row: Row, scale: float):
    cu_q = torch.tensor([0, row.q_len], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, row.k_len], dtype=torch.int32, device=q.device)
    return module.flash_attn_varlen_func(q, k, v, cu_q, cu_k, row.q_len, row.k_len, softmax_scale=scale,
                                         causal=row.causal, window_size=row.window, softcap=row.softcap)


def paged(module, q, k, v, row: Row, scale: float):
    k_cache, v_cache, table = to_paged(k, v)
    cu_q = torch.tensor([0, row.q_len], dtype=torch.int32, device=q.device)
    seq_lens = torch.tensor([row.k_len], dtype=torch.int32, device=q.device)
    return module.paged_attention(q, k_cache, v_cache, cu_q, seq_lens, table, row.q_len, row.k_len,
                                  softmax_scale=scale, causal=row.causal, window_size=row.window,
                                  softcap=row.softcap, num_splits=2)


CALLS = {"varlen": varlen, "paged": paged}
SCALE = HEAD_DIM ** -0.5


def _cases():
    for name, row in {**TABLE, **VARLEN_ONLY}.items():
        for call in CALLS:
            if call == "varlen" or name not in VARLEN_ONLY:
                yield pytest.param(row, call, id=f"{name}-{call}")


@pytest.mark.parametrize("row,call", list(_cases()))
def test_reference_follows_the_conventions(row, call):
    q, k, v = make_inputs(row, torch.float64)
    out = CALLS[call](reference, q, k, v, row, SCALE)
    torch.testing.assert_close(out, oracle(q, k, v, row, SCALE), rtol=0, atol=1e-12)


@pytest.mark.parametrize("row,call", list(_cases()))
def test_kernels_follow_the_conventions(device, row, call):
    """fp32 in the kernels: a convention off by one key changes outputs by ~1/window, far above 1e-4."""
    q, k, v = make_inputs(row, torch.float32)
    out = CALLS[call](kernels, q.to(device), k.to(device), v.to(device), row, SCALE)
    torch.testing.assert_close(out.cpu().double(), oracle(q, k, v, row, SCALE), rtol=0, atol=1e-4)


@pytest.mark.parametrize("sliding_window", [1, 5, 16])
def test_vllm_sliding_window_is_a_window_of_that_many_tokens(sliding_window):
    """What a vLLM layer's ``sliding_window`` becomes in the backends: (W - 1, 0)."""
    impl = PagedAttention(num_heads=NUM_HEADS, head_size=HEAD_DIM, num_kv_heads=NUM_KV_HEADS, scale=SCALE,
                          sliding_window=sliding_window)
    assert impl.window_size == sliding(sliding_window)
    mask = expected_mask(Row(1, 40, True, impl.window_size))
    assert mask.sum().item() == sliding_window and bool(mask[0, -1])  # the query and the W - 1 before it


def test_the_oracle_is_not_the_kernels_mask():
    """The hand-built masks agree with SDPA's own causal flag (top-left, for q_len == k_len) and
    differ from a shifted convention, so the table can tell conventions apart."""
    row = TABLE["prefill-causal"]
    q, k, v = make_inputs(row, torch.float64)
    group = NUM_HEADS // NUM_KV_HEADS
    k_h, v_h = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
    sdpa_causal = F.scaled_dot_product_attention(q.transpose(0, 1), k_h, v_h, is_causal=True, scale=SCALE)
    torch.testing.assert_close(oracle(q, k, v, row, SCALE), sdpa_causal.transpose(0, 1), rtol=0, atol=1e-12)
    window = TABLE["sliding-chunked"]
    off_by_one = window._replace(window=(window.window[0] + 1, 0))
    q, k, v = make_inputs(window, torch.float64)
    gap = (oracle(q, k, v, window, SCALE) - oracle(q, k, v, off_by_one, SCALE)).abs().max().item()
    assert gap > 1e-2
