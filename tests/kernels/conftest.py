"""Kernel tests: small shapes through the Triton interpreter on CPU, or compiled on a GPU.

TRITON_INTERPRET is read when the kernel modules are imported, so it is set here
before any of them is. With ``TRITON_INTERPRET=0`` on a CUDA machine the same
tests run compiled on the GPU (``device`` fixture), and the ``gpu``-marked tests
with realistic shapes run too.

Accuracy rule (flash-attn's): the kernel's largest error against a float64
reference may be at most twice torch's own error computing the same thing in
the same dtype, plus a floor from :data:`ATOL`, the one tolerance table.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from accel_plugin import kernels  # noqa: E402
from accel_plugin.kernels import reference  # noqa: E402

#: Error floor by dtype (absolute, on outputs of magnitude ~1). fp32 is held to 1e-5.
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
#: log-sum-exp is computed in fp32 from the (exact) low-precision inputs.
LSE_ATOL = 1e-4
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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


def torch_lowp_attention(q, k, v, softmax_scale, causal, window_size, softcap):
    """What plain torch gets for one sequence in q's dtype: scores, softmax and p @ v all in it."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    allowed = reference.attention_mask(q.shape[0], k.shape[0], causal, window_size, device=q.device)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


class Checker:
    """Compares kernel outputs with the float64 reference using the accuracy rule."""

    @staticmethod
    def max_err(a, b):
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0

    def allowed(self, dtype, torch_err):
        return 2.0 * torch_err + ATOL[dtype]

    def close(self, out, ref, lowp, dtype, what="out"):
        err, torch_err = self.max_err(out, ref), self.max_err(lowp, ref)
        limit = self.allowed(dtype, torch_err)
        assert err <= limit, f"{what}: max error {err:.3g} > {limit:.3g} (torch's own {dtype} error {torch_err:.3g})"

    def lse_close(self, lse, ref_lse):
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ"
        err = self.max_err(lse[finite], ref_lse[finite])
        assert err <= LSE_ATOL, f"lse: max error {err:.3g} > {LSE_ATOL}"


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
    return torch_lowp_attention
