"""Compile the kernels for a CUDA GPU on a machine without one (run by test_cuda_codegen.py).

Usage: python cuda_codegen_check.py ARCH   (ARCH = 90 for H100/H200, 80 for A100)

Triton ships ptxas, so compiling needs no GPU: a stand-in driver reports the
target, launches are turned into warmups (compile, no run), and the public
functions are called with CPU tensors as if they were CUDA tensors. This catches
what the interpreter cannot: constructs that do not lower, shared memory beyond
the device limit, and register spills.

Spills: Triton's ``kernel.n_spills`` is filled in only when a GPU loads the
binary, so here the cubin is read with the ``cuobjdump -res-usage`` that Triton
ships: REG is registers per thread, STACK the per-thread stack frame, which is
where ptxas puts spilled registers (these kernels have no local arrays or calls,
so STACK > 0 means spills; ``ptxas -v`` agrees). Each case names the archs where it
must not spill (those where it did not with triton 3.9: a regression fails); the
others print their stack frame, and docs/performance.md quotes them. Register
allocation is the compiler's, so that list holds for the triton it was recorded
with (:data:`SPILLS_RECORDED_WITH`); with another triton (3.3 in TGI's environment)
spills are printed as notes, while shared memory is still checked.

Prints one line per compiled kernel; "SKIP: ..." when this triton cannot compile
for CUDA here at all (checked on a trivial kernel), "FAIL: ..." lines and exit
status 1 on a violation.
"""

import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

#: the triton release whose register allocation the spill-free lists below record
SPILLS_RECORDED_WITH = "3.9."

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ARCH = int(sys.argv[1]) if len(sys.argv) > 1 else 90
SHARED_MEMORY = {90: 227 * 1024, 80: 163 * 1024}[ARCH]
BOTH = (80, 90)


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


def cuobjdump_path():
    """The cuobjdump that Triton ships (triton.knobs names it; older versions keep it in bin/)."""
    try:
        from triton import knobs

        path = knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError):
        import triton.backends.nvidia as nvidia

        path = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    if not path or not os.path.exists(path):
        raise FileNotFoundError(f"cuobjdump not found ({path!r})")
    return path


def resource_usage(kernel, tool):
    """{"REG": registers per thread, "STACK": stack frame bytes, "LOCAL": ...} of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(row for row in text.splitlines() if "REG:" in row)
    return {key: int(value) for key, value in re.findall(r"(\w+):(\d+)", line)}


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
    resource_usage(compiled[0][1], cuobjdump_path())
    compiled.clear()
    return compiled


def cases():
    """(label, launch, archs where it must not spill): the benchmark's configurations, the
    ones with the most shared memory, and every specialisation flag at least once."""
    from accel_plugin.kernels import _configs, _runtime, flash_attn, kv_cache, paged_attn

    _configs._info = lambda device: _configs.DeviceInfo(ARCH, 132, SHARED_MEMORY)
    _runtime.runtime_mode = lambda device: "compiled"  # what every kernel's preamble asks
    i32, bf16 = torch.int32, torch.bfloat16

    def flash(head_dim, dtype, **opts):
        q, k = torch.empty(64, 8, head_dim, dtype=dtype), torch.empty(64, 2, head_dim, dtype=dtype)
        cu = torch.tensor([0, 64], dtype=i32)
        return lambda: flash_attn.flash_attn_varlen_func(q, k, k, cu, cu, 64, 64, **opts)

    def paged(head_dim, dtype, q_len, num_splits, block_size=16, **opts):
        q = torch.empty(2 * q_len, 8, head_dim, dtype=dtype)
        cache = torch.empty(32, block_size, 2, head_dim, dtype=dtype)
        cu, lens = torch.tensor([0, q_len, 2 * q_len], dtype=i32), torch.tensor([300, 300], dtype=i32)
        return lambda: paged_attn.paged_attention(q, cache, cache, cu, lens, torch.zeros(2, 32, dtype=i32), q_len,
                                                  4096, num_splits=num_splits, **opts)

    def write_kv():
        k = torch.empty(8, 2, 128, dtype=bf16)
        cache = torch.empty(4, 16, 2, 128, dtype=bf16)
        return lambda: kv_cache.write_kv_cache(k, k, cache, cache, torch.zeros(8, dtype=torch.int64))

    return [
        ("prefill bf16 D=128", flash(128, bf16), ()),
        ("prefill bf16 D=128 causal", flash(128, bf16, causal=True), ()),
        ("prefill bf16 D=128 causal window softcap lse",
         flash(128, bf16, causal=True, window_size=(32, -1), softcap=30.0, return_lse=True), ()),
        ("prefill bf16 D=256", flash(256, bf16), BOTH),
        ("prefill fp32 D=96 causal", flash(96, torch.float32, causal=True), ()),
        ("decode bf16 D=128 split-K 8", paged(128, bf16, 1, 8), BOTH),
        ("verify fp16 D=80 block 24 window softcap", paged(80, torch.float16, 64, 1, block_size=24,
                                                            window_size=(100, -1), softcap=20.0), (90,)),
        ("write_kv bf16 D=128", write_kv(), BOTH),
    ]


def main():
    try:
        compiled = setup()
    except Exception as exc:  # this triton cannot target CUDA here: not our kernels' fault
        print(f"SKIP: triton cannot compile for sm_{ARCH} without a GPU here: {exc!r}")
        return 0
    tool = cuobjdump_path()
    import triton

    check_spills = triton.__version__.startswith(SPILLS_RECORDED_WITH)
    if not check_spills:
        print(f"NOTE: spills are checked only with triton {SPILLS_RECORDED_WITH}.x (this is {triton.__version__})")
    failures = []
    for label, launch, spill_free_on in cases():
        launch()
        for name, kernel in compiled:
            usage = resource_usage(kernel, tool)
            shared = kernel.metadata.shared
            print(f"sm_{ARCH} {name} shared={shared} warps={kernel.metadata.num_warps} regs={usage['REG']} "
                  f"stack={usage['STACK']} | {label}")
            if shared > SHARED_MEMORY:
                failures.append(f"{name} ({label}) needs {shared} bytes of shared memory, sm_{ARCH} has "
                                f"{SHARED_MEMORY}")
            if check_spills and ARCH in spill_free_on and (usage["STACK"] or usage.get("LOCAL", 0)):
                failures.append(f"{name} ({label}) spills registers on sm_{ARCH}: {usage['STACK']} bytes of "
                                f"stack frame, {usage['REG']} registers")
        compiled.clear()
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
