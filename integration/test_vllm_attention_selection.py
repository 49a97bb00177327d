"""How vLLM's own selection code resolves the accel backends, in process (no engine).

vLLM's CUDA build cannot run here, but its CUDA platform's selection code can: the
test stubs the compiled extension module the file imports and the device
capability, then calls ``CudaPlatform.get_attn_backend_cls`` exactly as vLLM's
selector does, with ``attention_config.backend`` parsed from our registered name.
The CPU platform is exercised the same way. A GPU run (tests marked ``gpu``)
would check the same with the real device.
"""

from __future__ import annotations

import sys
import types

import pytest

pytestmark = pytest.mark.vllm

FLASH_PATH = "accel_plugin.adapters.vllm.backend.AccelFlashBackend"
PAGED_PATH = "accel_plugin.adapters.vllm.backend.AccelPagedBackend"


@pytest.fixture(scope="module")
def registered():
    """register() as vLLM's entry point runs it (ACCEL_ATTENTION_BACKEND unset; an accel
    variable that selects nothing, ACCEL_METRICS, so that the plugin acts at all)."""
    import os

    assert "ACCEL_ATTENTION_BACKEND" not in os.environ or not os.environ["ACCEL_ATTENTION_BACKEND"]
    import accel_plugin.adapters.vllm as adapter
    from accel_plugin.adapters.vllm import _patches

    saved = os.environ.get("ACCEL_METRICS")
    os.environ["ACCEL_METRICS"] = "1"
    try:
        adapter.register()
        adapter.register()  # idempotent
    finally:
        if saved is None:
            os.environ.pop("ACCEL_METRICS")
        else:
            os.environ["ACCEL_METRICS"] = saved
    assert adapter._REGISTERED
    yield
    # what register() changed in this process (the metrics directory it exported included):
    # servers that later tests start must not inherit it
    _patches.undo_all()
    adapter._REGISTERED = False


@pytest.fixture
def selector_config():
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    def make(**changes):
        base = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None)
        return base._replace(**changes)

    return make


@pytest.fixture
def cuda_platform(monkeypatch, registered):
    """vLLM's CudaPlatform class, importable on a CPU-only machine, reporting capability 9.0."""
    monkeypatch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    monkeypatch.delitem(sys.modules, "vllm.platforms.cuda", raising=False)
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    monkeypatch.setattr(cuda.CudaPlatform, "get_device_capability",
                        classmethod(lambda cls, device_id=0: DeviceCapability(9, 0)))
    yield cuda.CudaPlatform
    from accel_plugin.adapters.vllm import _patches

    _patches.uninstall(cuda.CudaPlatform)
    _patches.set_env_choice(None)
    sys.modules.pop("vllm.platforms.cuda", None)


def _backend_from_cli(name):
    """``--attention-backend NAME`` as vLLM parses it into ``attention_config.backend``."""
    from vllm.config import AttentionConfig

    return AttentionConfig(backend=name).backend


@pytest.mark.parametrize("name, path", [("ACCEL_FLASH", FLASH_PATH), ("ACCEL_PAGED", PAGED_PATH)])
def test_cuda_platform_resolves_our_registered_name(cuda_platform, selector_config, name, path):
    backend = _backend_from_cli(name)
    assert backend.name == name
    assert cuda_platform.get_attn_backend_cls(backend, selector_config()) == path
    assert cuda_platform.get_attn_backend_cls(backend, selector_config(dtype=__import__("torch").float16,
                                                                       block_size=16)) == path


def test_cuda_platform_env_var_selects_without_flag(cuda_platform, selector_config):
    from accel_plugin.adapters.vllm import _patches

    _patches.install(cuda_platform)
    _patches.install(cuda_platform)  # idempotent
    _patches.set_env_choice("ACCEL_PAGED", "paged")
    assert cuda_platform.get_attn_backend_cls(None, selector_config()) == PAGED_PATH
    _patches.uninstall(cuda_platform)
    assert not _patches.installed(cuda_platform)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"head_size": 72}, "head size 72 is not supported (supported: 32, 64, 80, 96, 128, 256)"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype fp8 is not supported"),
        ({"kv_cache_dtype": "float16"}, "kv_cache_dtype float16 is not supported"),
        ({"use_mla": True}, "MLA (multi-head latent attention) models are not supported"),
        ({"attn_type": "encoder_only"}, "attention type encoder_only not supported"),
        ({"has_sink": True}, "attention sinks not supported"),
    ],
)
def test_cuda_platform_refuses_with_readable_reason(cuda_platform, selector_config, changes, expected):
    with pytest.raises(ValueError) as info:
        cuda_platform.get_attn_backend_cls(_backend_from_cli("ACCEL_FLASH"), selector_config(**changes))
    message = str(info.value)
    assert "ACCEL_FLASH is not valid for this configuration" in message
    assert expected in message
    assert "unset ACCEL_ATTENTION_BACKEND" in message


def test_compute_capability_below_ampere_is_refused(cuda_platform, selector_config, monkeypatch):
    from vllm.platforms.interface import DeviceCapability

    monkeypatch.setattr(cuda_platform, "get_device_capability",
                        classmethod(lambda cls, device_id=0: DeviceCapability(7, 5)))
    with pytest.raises(ValueError, match="below the required 8.0"):
        cuda_platform.get_attn_backend_cls(_backend_from_cli("ACCEL_FLASH"), selector_config())


def test_cpu_platform_honours_flag_and_refuses_unsupported(registered, selector_config):
    from vllm.platforms.cpu import CpuPlatform

    from accel_plugin.adapters.vllm import _patches

    assert _patches.installed(CpuPlatform)
    cpu_cfg = selector_config(dtype=__import__("torch").float32, block_size=32)
    # No accel request and the variable unset: vLLM's own choice.
    assert CpuPlatform.get_attn_backend_cls(None, cpu_cfg).endswith("CPUAttentionBackend")
    assert CpuPlatform.get_attn_backend_cls(_backend_from_cli("ACCEL_FLASH"), cpu_cfg) == FLASH_PATH
    with pytest.raises(ValueError, match="MLA"):
        CpuPlatform.get_attn_backend_cls(_backend_from_cli("ACCEL_PAGED"), cpu_cfg._replace(use_mla=True))


def test_kv_cache_layout_gives_the_kernel_layout(registered):
    """LBNHC: K and V views are [num_blocks, block_size, num_kv_heads, head_size]."""
    import torch
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from accel_plugin.adapters.vllm import _compat
    from accel_plugin.adapters.vllm.backend import AccelFlashBackend

    assert AccelFlashBackend.supported_kv_cache_layouts()[0] is KVCacheLayout.LBNHC
    num_blocks, heads, block, dim = 3, 2, 16, 32
    physical = torch.arange(num_blocks * block * heads * 2 * dim, dtype=torch.float32)
    physical = physical.view(num_blocks, block, heads, 2 * dim)  # LBNHC memory order
    logical = physical.permute(0, 2, 1, 3)  # what vLLM hands the backend: [B, H, N, C]
    k_cache, v_cache = _compat.split_kv_cache(logical, dim)
    assert k_cache.shape == v_cache.shape == (num_blocks, block, heads, dim)
    assert torch.equal(k_cache, physical[..., :dim]) and torch.equal(v_cache, physical[..., dim:])
