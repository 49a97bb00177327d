"""Kernel tests: small shapes in the Triton interpreter on CPU, or compiled on a GPU.

Where they run is decided by tests/conftest.py (its docstring has the table): on a
CUDA machine the kernels compile and the small shapes run on cuda (``device``
fixture) next to the ``gpu``-marked tests with realistic shapes; without one they
run in the interpreter on CPU.

Accuracy rule (flash-attn's): the kernel's largest error against a float64 reference
(computed on the GPU for the realistic shapes) may be at most twice torch's own error
computing the same thing in the same dtype, plus a floor derived from the case
(:meth:`Checker.floor`): the floor covers what torch's own error may miss, and
grows with the scores because ``exp(s - m)`` in fp32 has a relative error of
about ``eps * |s|``.
"""

import math

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.kernels import reference

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Machine epsilon by dtype (the gap between 1 and the next number).
EPS = {dtype: torch.finfo(dtype).eps for dtype in DTYPES}
FP32_EPS = EPS[torch.float32]
#: The floor's constants, in units of eps (one tolerance table for every dtype):
#: OUT: the output is rounded once to its dtype (and p once before p @ v in fp16/bf16);
#: SCORE: the kernels compute scores and softmax in fp32 whatever the dtype: each
#: ``exp2(s - m)`` carries a relative error of a few eps * |s| (s, m and s - m rounded,
#: the dot product's own rounding), so it scales with the largest score;
#: LSE: the log-sum-exp, in fp32 from the same scores, of magnitude about max |s| + log(keys);
#: the running sum over key tiles adds a rounding per tile.
#: Measured in the interpreter: at most 1.5 eps * |s| * |out| (out), 1.3 eps * |lse| (lse).
FLOOR_ULPS = {"out": 1.0, "score": 8.0, "lse": 16.0}


def pytest_report_header(config):
    return f"accel_plugin.kernels: {kernels.runtime_mode_reason('cpu')}"


@pytest.fixture(scope="session")
def device():
    """Where the small-shape suite runs: the interpreter on CPU, or compiled on CUDA."""
    if kernels.runtime_mode("cpu") == "interpreter":
        return torch.device("cpu")
    if kernels.runtime_mode("cuda") == "compiled":
        return torch.device("cuda")
    pytest.skip("needs TRITON_INTERPRET=1 (set before import) or a CUDA GPU")


class TorchLowp:
    """Torch's own computation in the inputs' dtype (scores, softmax and p @ v all in it):
    the yardstick of the accuracy rule. Call it on one sequence, or use :meth:`varlen` /
    :meth:`paged` for a packed batch (same arguments as the kernels)."""

    def __call__(self, q, k, v, softmax_scale, causal, window_size, softcap):
        """One sequence: q [q_len, H, D], k/v [k_len, Hkv, D] -> [q_len, H, D]."""
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        allowed = reference.attention_mask(q.shape[0], k.shape[0], causal, window_size, device=q.device)
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        return torch.einsum("hqk,khd->qhd", p, v)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
               window_size=(-1, -1), softcap=0.0):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros_like(q)
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(len(cu_q) - 1):
            rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            out[rows] = self(q[rows], k[keys], v[keys], scale, causal, window_size, softcap)
        return out

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, softmax_scale=None, causal=True,
              window_size=(-1, -1), softcap=0.0):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros_like(q)
        cu_q = cu_seqlens_q.tolist()
        for b, seq_len in enumerate(seq_lens.tolist()):
            rows = slice(cu_q[b], cu_q[b + 1])
            k = reference.gather_kv(k_cache, block_table[b], seq_len)
            v = reference.gather_kv(v_cache, block_table[b], seq_len)
            out[rows] = self(q[rows], k, v, scale, causal, window_size, softcap)
        return out


class Checker:
    """Compares kernel outputs with a reference using the accuracy rule.

    ``max_score`` (from :meth:`max_score`) is the largest |score| of the case; the
    floor is derived from it and from the outputs' magnitude, so a case with scores
    of hundreds gets the fp32 slack it needs and an ordinary one stays tight.
    """

    @staticmethod
    def max_err(a, b):
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0

    @staticmethod
    def max_score(q, k, softmax_scale=None, softcap=0.0):
        """Largest |q_i . k_j| * scale (after softcap) over every query row and key of the same
        head group: an upper bound on the case's scores, masks ignored.

        q: [total_q, num_heads, head_dim]; k: [total_k, num_kv_heads, head_dim] or a paged
        cache [num_blocks, block_size, num_kv_heads, head_dim].
        """
        num_kv_heads, head_dim = k.shape[-2], k.shape[-1]
        k = k.reshape(-1, num_kv_heads, head_dim).float()
        if q.shape[0] == 0 or k.shape[0] == 0:
            return 0.0
        scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
        group = q.shape[1] // num_kv_heads
        rows_per_chunk = max(1, (1 << 26) // (q.shape[1] * k.shape[0]))  # at most 64M scores at a time
        largest = 0.0
        for start in range(0, q.shape[0], rows_per_chunk):
            rows = q[start:start + rows_per_chunk].float().view(-1, num_kv_heads, group, head_dim)
            s = torch.einsum("tgjd,sgd->gjts", rows, k)
            largest = max(largest, s.abs().max().item() * scale)
        return softcap * math.tanh(largest / softcap) if softcap > 0 else largest

    @staticmethod
    def floor(dtype, max_score, out_scale):
        """The error allowed besides torch's own, for outputs of magnitude ``out_scale``
        (the reference's largest |value|): one eps of the dtype for rounding the output,
        and FLOOR_ULPS["score"] fp32 eps per unit of the largest score for the softmax."""
        return out_scale * (FLOOR_ULPS["out"] * EPS[dtype]
                            + FLOOR_ULPS["score"] * FP32_EPS * max(1.0, max_score))

    def verdict(self, out, ref, lowp, dtype, max_score):
        """(err, limit, torch_err): the kernel's max error, what the rule allows, torch's own."""
        err, torch_err = self.max_err(out, ref), self.max_err(lowp, ref)
        out_scale = ref.abs().max().item() if ref.numel() else 0.0
        return err, 2.0 * torch_err + self.floor(dtype, max_score, out_scale), torch_err

    def close(self, out, ref, lowp, dtype, *, max_score, what="out"):
        err, limit, torch_err = self.verdict(out, ref, lowp, dtype, max_score)
        assert err <= limit, (f"{what}: max error {err:.3g} > {limit:.3g} (torch's own {dtype} error "
                              f"{torch_err:.3g}, largest |score| {max_score:.3g})")

    def lse_close(self, lse, ref_lse, *, max_score):
        """The log-sum-exp is fp32 whatever the dtype: FLOOR_ULPS["lse"] fp32 eps per unit of
        its magnitude (at least the largest score)."""
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ"
        err = self.max_err(lse[finite], ref_lse[finite])
        magnitude = max(1.0, max_score, ref_lse[finite].abs().max().item() if finite.any() else 0.0)
        limit = FLOOR_ULPS["lse"] * FP32_EPS * magnitude
        assert err <= limit, f"lse: max error {err:.3g} > {limit:.3g} (largest |score| {max_score:.3g})"


@pytest.fixture(scope="session")
def check():
    return Checker()


class Inputs:
    """Random packed inputs; lengths are python lists."""

    def __init__(self, device):
        self.device = device
        self.gen = torch.Generator().manual_seed(0)

    def randn(self, *shape, dtype):
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32).to(dtype).to(self.device)

    def cu_seqlens(self, lens):
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return torch.tensor(cu, dtype=torch.int32, device=self.device)

    def varlen(self, q_lens, k_lens, num_heads, num_kv_heads, head_dim, dtype, pad_rows=0):
        """q [sum(q_lens) + pad_rows, H, D], k, v [sum(k_lens), Hkv, D], cu_seqlens_q, cu_seqlens_k."""
        q = self.randn(sum(q_lens) + pad_rows, num_heads, head_dim, dtype=dtype)
        k = self.randn(sum(k_lens), num_kv_heads, head_dim, dtype=dtype)
        v = self.randn(sum(k_lens), num_kv_heads, head_dim, dtype=dtype)
        return q, k, v, self.cu_seqlens(q_lens), self.cu_seqlens(k_lens)

    def paged(self, q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, pad_rows=0,
              spare_blocks=3, garbage_tail=True):
        """q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table with shuffled blocks.

        Each sequence gets one unused trailing block_table entry; with ``garbage_tail`` it holds
        a valid but foreign block index, so reading past seq_len would show in the result.
        """
        used = [-(-n // block_size) for n in seq_lens]
        max_blocks = max(used) + 1
        num_blocks = sum(used) + spare_blocks
        perm = torch.randperm(num_blocks, generator=self.gen).tolist()
        table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
        start = 0
        for b, n in enumerate(used):
            table[b, :n] = torch.tensor(perm[start:start + n], dtype=torch.int32)
            table[b, n:] = perm[-1] if garbage_tail else 0
            start += n
        k_cache = self.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
        v_cache = self.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
        q = self.randn(sum(q_lens) + pad_rows, num_heads, head_dim, dtype=dtype)
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=self.device)
        return q, k_cache, v_cache, self.cu_seqlens(q_lens), seq_lens_t, table.to(self.device)


@pytest.fixture
def inputs(device):
    return Inputs(device)


@pytest.fixture(scope="session")
def lowp():
    return TorchLowp()
