"""Dispatch: compiled / interpreter / torch CPU path, the reasons given, and the one-time warning."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import accel_plugin.kernels as kernels
from accel_plugin.kernels import _runtime, _validation, reference


def test_public_api():
    for name in ("flash_attn_varlen_func", "paged_attention", "write_kv_cache", "runtime_mode",
                 "runtime_mode_reason", "SUPPORTED_HEAD_SIZES", "SUPPORTED_DTYPES", "MIN_BLOCK_SIZE",
                 "MAX_BLOCK_SIZE", "reference"):
        assert name in kernels.__all__ and hasattr(kernels, name)
    assert kernels.SUPPORTED_HEAD_SIZES == (32, 64, 80, 96, 128, 256)
    assert kernels.SUPPORTED_DTYPES == (torch.float16, torch.bfloat16, torch.float32)
    assert (kernels.MIN_BLOCK_SIZE, kernels.MAX_BLOCK_SIZE) == (16, 256)


@pytest.mark.parametrize("device_type,interpreted,cuda,expected", [
    ("cpu", True, False, "interpreter"),
    ("cuda", True, True, "interpreter"),
    ("cuda", False, True, "compiled"),
    ("cpu", False, True, "torch"),
    ("cpu", False, False, "torch"),
    ("cuda", False, False, "torch"),
])
def test_resolve_mode(device_type, interpreted, cuda, expected):
    assert _runtime.resolve_mode(device_type, interpreted, cuda) == expected


def test_mode_in_this_suite():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels are not interpreted in this run (TRITON_INTERPRET is not 1)")
    assert kernels.runtime_mode("cpu") == "interpreter"
    assert kernels.runtime_mode(torch.device("cpu")) == "interpreter"
    assert kernels.runtime_mode_reason("cpu") == "TRITON_INTERPRET=1: Triton interpreter on CPU"
    assert kernels.runtime_mode() in ("interpreter", "compiled")


def test_reference_fallback_warns_once(monkeypatch):
    monkeypatch.setattr(_runtime, "runtime_mode", lambda device: "torch")
    monkeypatch.setattr(_runtime, "_warned", False)
    q = torch.randn(5, 2, 32)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kernels.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5, causal=True)
        kernels.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5, causal=True)
    assert [w.category for w in caught] == [RuntimeWarning]
    assert caught[0].filename == __file__  # points at the caller of the kernel function
    assert str(caught[0].message).startswith("accel_plugin.kernels: ")
    assert "Results are exact" in str(caught[0].message)
    torch.testing.assert_close(out, reference.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5, causal=True))


def run_python(code, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_without_interpreter_on_cpu():
    """No driver access at import; CPU calls run the torch CPU path with one warning."""
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU fallback")
    result = run_python("""
        import os, warnings, torch
        import accel_plugin.kernels as K
        print(K.runtime_mode("cpu"), "|", K.runtime_mode_reason())
        q = torch.randn(3, 2, 32); cu = torch.tensor([0, 3], dtype=torch.int32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = K.flash_attn_varlen_func(q, q, q, cu, cu, 3, 3)
            K.write_kv_cache(q[:, :1], q[:, :1], torch.zeros(1, 16, 1, 32), torch.zeros(1, 16, 1, 32),
                             torch.tensor([0, 1, -1]))
        print(len(caught), out.shape)
        os.environ["TRITON_INTERPRET"] = "1"  # too late: the kernels are already jitted
        print(K.runtime_mode("cpu"), "|", K.runtime_mode_reason("cpu"))
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the native kernels build on this machine (tests/kernels/test_cpu_attention.py requires it)
    assert lines[0] == ("torch | no CUDA device and TRITON_INTERPRET unset: native C++ CPU kernel (paged decode, "
                        "OpenMP) + torch CPU path (SDPA, batched) for prefill")
    assert lines[1] == "1 torch.Size([3, 2, 32])"
    assert lines[2].startswith("torch | TRITON_INTERPRET was set after accel_plugin.kernels was imported")


def test_torch_path_of_paged_and_kv_write_validates_once_and_matches(monkeypatch):
    """The torch path validates at the kernel's entry (contents included) and never calls
    the reference's validation."""
    monkeypatch.setattr(_runtime, "runtime_mode", lambda device: "torch")
    calls = []
    for name in ("validate_paged", "validate_write_kv"):
        original = getattr(_validation, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(reference, name, counting)  # what the reference itself would call
    torch.manual_seed(0)
    k_cache, v_cache = torch.zeros(4, 16, 1, 32), torch.zeros(4, 16, 1, 32)
    k, v = torch.randn(20, 1, 32), torch.randn(20, 1, 32)
    slots = torch.cat([torch.arange(16, 32), torch.arange(48, 52)])  # blocks 1 and 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels.write_kv_cache(k, v, k_cache, v_cache, slots)
        q = torch.randn(3, 2, 32)
        cu = torch.tensor([0, 3], dtype=torch.int32)
        lens = torch.tensor([20], dtype=torch.int32)
        table = torch.tensor([[1, 3]], dtype=torch.int32)
        out = kernels.paged_attention(q, k_cache, v_cache, cu, lens, table, 3, 20)
        assert calls == []  # the kernel entry validated; the reference did not again
        expected = reference.paged_attention(q, k_cache, v_cache, cu, lens, table, 3, 20)
        torch.testing.assert_close(out, expected)
        with pytest.raises(ValueError, match="block_table entries"):
            kernels.paged_attention(q, k_cache, v_cache, cu, lens, torch.tensor([[1, 9]], dtype=torch.int32), 3, 20)


def test_an_unusable_interpreter_is_refused_with_the_versions_and_the_fix(monkeypatch):
    """triton 3.3's interpreter with numpy 2.4 (seen in the compatibility matrix) fails
    every kernel loop with an opaque InterpreterError; the kernels say why instead."""
    from accel_plugin.kernels import _runtime

    class Broken:
        def __getitem__(self, grid):
            def launch(*args):
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
            return launch

    monkeypatch.setattr(_runtime, "_interpreter_checked", None)
    monkeypatch.setattr(_runtime, "_loop_probe", Broken())
    for _ in range(2):  # decided once, raised on every call
        with pytest.raises(_runtime.InterpreterUnusable) as err:
            _runtime.check_interpreter()
        message = str(err.value)
        assert f"triton {_runtime.triton.__version__}" in message and "numpy" in message
        assert "pip install 'numpy<2.4'" in message and "unset TRITON_INTERPRET" in message


def test_the_interpreter_probe_passes_here(monkeypatch):
    from accel_plugin.kernels import _runtime

    if not _runtime.kernels_interpreted():
        pytest.skip("kernels are not interpreted in this process")
    monkeypatch.setattr(_runtime, "_interpreter_checked", None)
    _runtime.check_interpreter()
    assert _runtime._interpreter_checked == "ok"
