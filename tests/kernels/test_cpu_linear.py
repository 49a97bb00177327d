"""kernels/cpu_linear.py and csrc/cpu_linear.cpp: the native few-row product equals F.linear.

Every row count of a register tile and past it (1-6 rows per tile, 7-13 rows two tiles,
a prompt of 70), output widths that fill the 64-column blocks and ones that do not (the
masked last block), odd inner sizes, a bias, leading batch dimensions; then the
refusals with what they name. The same for bfloat16 matrices (against F.linear of the
bfloat16-rounded operands), where the build has AVX512-BF16. Skipped where the native
library cannot be built or has no AVX-512F (``cpu_linear.reason()`` says which).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.kernels import cpu_linear

pytestmark = pytest.mark.skipif(cpu_linear.ops() is None, reason=f"native product: {cpu_linear.reason()}")


BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    cpu_linear.ops(torch.bfloat16) is None, reason=f"bfloat16 matrices: {cpu_linear.reason(torch.bfloat16)}"))
DTYPES = [torch.float32, BF16]


def _check(rows: int, n: int, k: int, bias: bool, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = torch.randn(n, generator=gen) if bias else None
    x = torch.randn(rows, k, generator=gen)
    pack, linear = cpu_linear.ops(dtype)
    out = linear(x, pack(w), b)
    assert out.shape == (rows, n) and out.dtype == torch.float32 and out.is_contiguous()
    # bfloat16: both operands rounded to bfloat16, the products summed in float32
    want = F.linear(x.to(dtype).float(), w.to(dtype).float(), b)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 70])
@pytest.mark.parametrize("n, k", [(64, 64), (576, 1536), (960, 576), (100, 37), (5, 3), (130, 1)])
def test_equals_f_linear(rows, n, k, dtype):
    _check(rows, n, k, bias=False, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 20), n=st.integers(1, 200), k=st.integers(1, 300), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_equals_f_linear_for_any_shape(rows, n, k, bias, seed, dtype):
    _check(rows, n, k, bias, seed, dtype)


def test_leading_dimensions_and_the_layout():
    w = torch.randn(100, 72)
    packed = cpu_linear.pack(w)
    assert packed.n == 100 and packed.packed.shape == (2, 72, 64)  # two blocks, the second zero-padded
    assert torch.equal(packed.packed[1, :, 36:], torch.zeros(72, 28))
    x = torch.randn(2, 3, 72)
    torch.testing.assert_close(cpu_linear.linear(x, packed), F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(cpu_linear.ops(torch.bfloat16) is None, reason=str(cpu_linear.reason(torch.bfloat16)))
def test_the_bfloat16_layout_pairs_k_per_column():
    w = torch.randn(70, 5)
    packed = cpu_linear.pack_bf16(w)
    assert packed.n == 70 and packed.packed.shape == (2, 3, 64, 2) and packed.packed.dtype == torch.bfloat16
    assert torch.equal(packed.packed[0, 1, 7], w[7, 2:4].bfloat16())  # column 7, k 2 and 3
    assert torch.equal(packed.packed[0, 2, :, 1], torch.zeros(64, dtype=torch.bfloat16))  # k padded to 6
    assert torch.equal(packed.packed[1, :, 6:], torch.zeros(3, 58, 2, dtype=torch.bfloat16))  # columns 70..127


@pytest.mark.parametrize("call, needle", [
    (lambda: torch.ops.accel_cpu.skinny_pack(torch.randn(4)), "the matrix must be 2-D"),
    (lambda: torch.ops.accel_cpu.skinny_pack(torch.randn(4, 4, dtype=torch.float64)), "float32 or bfloat16 CPU"),
    (lambda: torch.ops.accel_cpu.skinny_linear(torch.randn(2, 5), cpu_linear.pack(torch.randn(8, 4)).packed, 8),
     "x's last dimension 5 does not match the packed matrix's K = 4"),
    (lambda: torch.ops.accel_cpu.skinny_linear(torch.randn(2, 4), cpu_linear.pack(torch.randn(8, 4)).packed, 65),
     "n = 65 does not match the packed matrix's 1 blocks of 64 columns"),
    (lambda: torch.ops.accel_cpu.skinny_linear(torch.randn(2, 4), torch.randn(8, 4), 8),
     "packed must be skinny_pack's"),
    (lambda: torch.ops.accel_cpu.skinny_linear(torch.randn(2, 4, dtype=torch.float64),
                                               cpu_linear.pack(torch.randn(8, 4)).packed, 8), "x must be float32"),
])
def test_wrong_arguments_are_refused_with_what_is_expected(call, needle):
    with pytest.raises(RuntimeError, match=needle):
        call()


def test_ops_is_none_off_cpu_or_for_other_dtypes():
    assert cpu_linear.ops(torch.float16) is None and cpu_linear.ops(torch.float32, "meta") is None
    pack, linear = cpu_linear.ops()
    assert pack is cpu_linear.pack and linear is cpu_linear.linear


def test_the_build_child_runs_outside_the_callers_directory(monkeypatch, tmp_path):
    """``python -m`` puts the working directory first on sys.path: run from a source checkout
    (whose accel_plugin/ has no kernels/) next to a non-editable install, the child found no
    ``accel_plugin.kernels`` (seen in TGI's venv). It runs in the build directory instead."""
    import subprocess

    from accel_plugin.kernels import cpu_native

    seen = {}
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cpu_native.subprocess, "run",
                        lambda cmd, **kw: seen.update(cmd=cmd, **kw) or subprocess.CompletedProcess(cmd, 1, "", "x"))
    assert cpu_native._build_in_child().startswith("the build failed (exit 1)")
    assert seen["cwd"] == str(cpu_native.build_dir()) and seen["cmd"][1:] == ["-m", "accel_plugin.kernels.cpu_native"]
