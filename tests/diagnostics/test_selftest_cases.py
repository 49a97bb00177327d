"""The self-test's grid: every head size, block size and GQA ratio for each kernel and dtype."""

from __future__ import annotations

from accel_plugin.diagnostics import selftest_cases
from accel_plugin.kernels import limits


def test_grid_covers_every_value_for_each_kernel_and_dtype():
    cases = selftest_cases.default_cases()
    for kernel in selftest_cases.KERNELS:
        for dtype in limits.DTYPE_NAMES:
            mine = [c for c in cases if c.kernel == kernel and c.dtype == dtype]
            assert {c.head_size for c in mine} >= {64, 128, 80}, (kernel, dtype)
            assert all(c.head_size in limits.HEAD_SIZES for c in mine)
            if kernel != selftest_cases.FLASH:
                assert {c.block_size for c in mine} == {16, 32}, (kernel, dtype)
            if kernel != selftest_cases.WRITE_KV:
                assert {c.gqa for c in mine} == {1, 4}, (kernel, dtype)
    assert {c.variant for c in cases if c.kernel == selftest_cases.PAGED} == {"mixed", "split-K"}
    assert selftest_cases.default_cases(kernels=(selftest_cases.PAGED,), dtypes=("float32",)) == [
        c for c in cases if c.kernel == selftest_cases.PAGED and c.dtype == "float32"]
