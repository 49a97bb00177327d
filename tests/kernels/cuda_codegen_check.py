"""Compile the kernels for a CUDA GPU on a machine without one (run by test_cuda_codegen.py).

Usage: python cuda_codegen_check.py ARCH   (ARCH = 90 for H100/H200, 80 for A100)

Triton ships ptxas, so compiling needs no GPU: a stand-in driver reports the
target, launches are turned into warmups (compile, no run), and the public
functions are called with CPU tensors as if they were CUDA tensors. This catches
what the interpreter cannot: constructs that do not lower, and shared memory
beyond the device limit. Prints one line per compiled kernel; "SKIP: ..." when
this triton cannot compile for CUDA here at all (checked on a trivial kernel).
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ARCH = int(sys.argv[1]) if len(sys.argv) > 1 else 90
SHARED_MEMORY = {90: 227 * 1024, 80: 163 * 1024}[ARCH]


class StandInDriver:
    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


@triton.jit
def _trivial(x_ptr, N: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, N), tl.arange(0, N).to(tl.float32))


def setup():
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(StandInDriver(GPUTarget("cuda", ARCH, 32)))
    compiled = []
    original_run = JITFunction.run

    def warmup_only(self, *args, grid, warmup, **kwargs):
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = warmup_only
    _trivial[(1,)](torch.empty(16), N=16)
    compiled.clear()
    return compiled


def launches():
    from accel_plugin.kernels import _configs, flash_attn, kv_cache, paged_attn

    _configs._info = lambda device: _configs.DeviceInfo(ARCH, 132, SHARED_MEMORY)
    for module in (flash_attn, paged_attn, kv_cache):
        module.runtime_mode = lambda device: "compiled"
    i32 = torch.int32

    def flash(head_dim, dtype, **opts):
        q, k = torch.empty(64, 8, head_dim, dtype=dtype), torch.empty(64, 2, head_dim, dtype=dtype)
        cu = torch.tensor([0, 64], dtype=i32)
        flash_attn.flash_attn_varlen_func(q, k, k, cu, cu, 64, 64, **opts)

    def paged(head_dim, dtype, q_len, num_splits, block_size=16, **opts):
        q = torch.empty(2 * q_len, 8, head_dim, dtype=dtype)
        cache = torch.empty(32, block_size, 2, head_dim, dtype=dtype)
        cu, lens = torch.tensor([0, q_len, 2 * q_len], dtype=i32), torch.tensor([300, 300], dtype=i32)
        paged_attn.paged_attention(q, cache, cache, cu, lens, torch.zeros(2, 32, dtype=i32), q_len, 4096,
                                   num_splits=num_splits, **opts)

    # The configs with the most shared memory, and every specialisation flag at least once.
    flash(128, torch.bfloat16, causal=True, window_size=(32, -1), softcap=30.0, return_lse=True)
    flash(256, torch.bfloat16)
    flash(96, torch.float32, causal=True)
    paged(128, torch.bfloat16, 1, 8)
    paged(80, torch.float16, 64, 1, block_size=24, window_size=(100, -1), softcap=20.0)
    k = torch.empty(8, 2, 128, dtype=torch.bfloat16)
    kv_cache.write_kv_cache(k, k, torch.empty(4, 16, 2, 128, dtype=torch.bfloat16),
                            torch.empty(4, 16, 2, 128, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.int64))


def main():
    try:
        compiled = setup()
    except Exception as exc:  # this triton cannot target CUDA here: not our kernels' fault
        print(f"SKIP: triton cannot compile for sm_{ARCH} without a GPU here: {exc!r}")
        return 0
    launches()
    for name, kernel in compiled:
        shared = kernel.metadata.shared
        print(f"sm_{ARCH} {name} shared={shared} warps={kernel.metadata.num_warps}")
        if shared > SHARED_MEMORY:
            print(f"FAIL: {name} needs {shared} bytes of shared memory, sm_{ARCH} has {SHARED_MEMORY}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
