"""Our backends' declared capabilities match what the kernels accept."""

from accel_plugin.plugins import builtin
from accel_plugin.plugins.manager import get_plugin_manager, get_registries


def test_capabilities_match_the_kernels():
    import accel_plugin.kernels as kernels

    caps = builtin._CAPABILITIES
    assert caps.head_sizes == tuple(kernels.SUPPORTED_HEAD_SIZES)
    assert caps.dtypes == tuple(str(d).removeprefix("torch.") for d in kernels.SUPPORTED_DTYPES)
    assert all(kernels.MIN_BLOCK_SIZE <= b <= kernels.MAX_BLOCK_SIZE for b in caps.block_sizes)


def test_builtin_plugin_offers_both_backends_to_the_adapters():
    from accel_plugin.plugins.hookspecs import AdapterComponents

    pm = get_plugin_manager({})
    registries = get_registries(pm)
    for framework in ("vllm", "tgi"):
        components = AdapterComponents(framework=framework)
        pm.hook.accel_adapter_components(components=components)
        assert components.attention_backends == ["ACCEL_FLASH", "ACCEL_PAGED"]
        for name in components.attention_backends:
            assert registries.backends.get(name).priority > 0
    other = AdapterComponents(framework="sglang")
    pm.hook.accel_adapter_components(components=other)
    assert other.attention_backends == []


def test_the_proposer_registered_is_the_core_one():
    """The core names no adapter: the registry holds the framework-neutral proposer."""
    from accel_plugin.speculative import DomainProposer

    spec = get_registries(get_plugin_manager({})).proposers.get("ACCEL_DOMAIN_DRAFT")
    assert spec.load() is DomainProposer
    assert not spec.class_path.startswith("accel_plugin.adapters")
    assert spec.frameworks == ("vllm", "tgi")


def test_capability_numbers_come_from_the_kernels_limits():
    from accel_plugin.kernels import limits

    caps = builtin._CAPABILITIES
    assert (caps.head_sizes, caps.dtypes, caps.min_cuda_capability) == (
        limits.HEAD_SIZES, limits.DTYPE_NAMES, limits.MIN_CUDA_CAPABILITY)
    assert caps.block_sizes == (16, 32, 64, 128, 256)


def test_reading_the_limits_imports_neither_torch_nor_triton():
    import subprocess
    import sys

    code = ("import sys; import accel_plugin.plugins.builtin, accel_plugin.kernels.limits; "
            "print(sorted({'torch', 'triton'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
