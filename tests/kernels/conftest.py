"""Kernel tests: small shapes in the Triton interpreter on CPU, or compiled on a GPU.

Where they run is decided by tests/conftest.py (its docstring has the table): on a
CUDA machine the kernels compile and the small shapes run on cuda (``device``
fixture) next to the ``gpu``-marked tests with realistic shapes; without one they
run in the interpreter on CPU.

Accuracy rule: :mod:`accel_plugin.kernels.tolerance` (flash-attn's rule: at most twice
torch's own error in the same dtype plus a floor derived from the case), shared with
``accel doctor --self-test``; :class:`Checker` turns it into assertions.
"""

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.kernels import tolerance
from accel_plugin.kernels.tolerance import EPS, FLOOR_ULPS, FP32_EPS, TorchLowp  # noqa: F401  (the rule's names)

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


class Checker:
    """Compares kernel outputs with a reference using the accuracy rule
    (:mod:`accel_plugin.kernels.tolerance`), as assertions.

    ``max_score`` (from :meth:`max_score`) is the largest |score| of the case; the
    floor is derived from it and from the outputs' magnitude, so a case with scores
    of hundreds gets the fp32 slack it needs and an ordinary one stays tight.
    """

    max_err = staticmethod(tolerance.max_err)
    max_score = staticmethod(tolerance.max_score)
    floor = staticmethod(tolerance.floor)
    verdict = staticmethod(tolerance.verdict)

    def close(self, out, ref, lowp, dtype, *, max_score, what="out"):
        err, limit, torch_err = self.verdict(out, ref, lowp, dtype, max_score)
        assert err <= limit, (f"{what}: max error {err:.3g} > {limit:.3g} (torch's own {dtype} error "
                              f"{torch_err:.3g}, largest |score| {max_score:.3g})")

    def lse_close(self, lse, ref_lse, *, max_score):
        """The log-sum-exp is fp32 whatever the dtype (:func:`~accel_plugin.kernels.tolerance.lse_limit`)."""
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ"
        err = self.max_err(lse[finite], ref_lse[finite])
        limit = tolerance.lse_limit(ref_lse[finite], max_score)
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
