"""Our backends' declared capabilities match what the kernels accept."""

from accel_plugin import builtin
from accel_plugin.manager import get_plugin_manager, get_registries


def test_capabilities_match_the_kernels():
    import accel_plugin.kernels as kernels

    caps = builtin._CAPABILITIES
    assert caps.head_sizes == tuple(kernels.SUPPORTED_HEAD_SIZES)
    assert caps.dtypes == tuple(str(d).removeprefix("torch.") for d in kernels.SUPPORTED_DTYPES)
    assert all(kernels.MIN_BLOCK_SIZE <= b <= kernels.MAX_BLOCK_SIZE for b in caps.block_sizes)


def test_builtin_plugin_offers_both_backends_to_the_adapters():
    from accel_plugin.hookspecs import AdapterComponents

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
