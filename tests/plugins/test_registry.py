import pytest

from accel_plugin.plugins.registry import BackendRegistry, BackendSpec, Capabilities, DuplicateNameError, UnknownNameError, import_object


def test_unknown_name_lists_known_ones():
    registry = BackendRegistry()
    registry.register(BackendSpec("A", "x:y"))
    registry.register(BackendSpec("B", "x:y"))
    with pytest.raises(UnknownNameError) as info:
        registry.get("C")
    assert str(info.value) == "unknown attention backend 'C'; known attention backends: A, B"


def test_duplicate_name_is_refused():
    registry = BackendRegistry()
    registry.register(BackendSpec("A", "x:y"))
    with pytest.raises(DuplicateNameError, match="'A' is registered twice"):
        registry.register(BackendSpec("A", "x:z"))


def test_capabilities_check_gives_reasons():
    caps = Capabilities(dtypes=("float16",), head_sizes=(64,), block_sizes=(16,), devices=("cuda",), min_cuda_capability=(8, 0))
    assert caps.check(device="cuda", dtype="torch.float16", head_size=64, block_size=16, cuda_capability=(9, 0)) == []
    reasons = caps.check(device="cuda", dtype="float32", head_size=72, block_size=8, cuda_capability=(7, 5), features=("softcap",))
    assert reasons == [
        "dtype float32 not supported (supported: float16)",
        "head size 72 not supported (supported: 64)",
        "block size 8 not supported (supported: 16)",
        "CUDA capability 7.5 is below the required 8.0",
        "feature 'softcap' not supported",
    ]
    assert caps.check(device="cpu") == ["device 'cpu' not supported (supported: cuda)"]


def test_capabilities_left_unset_restrict_nothing():
    """A plugin declares its own numbers; fields it leaves out impose nothing."""
    caps = Capabilities(devices=("cuda",))
    assert caps.check(device="cuda", dtype="float64", head_size=72, block_size=8, cuda_capability=(6, 0)) == []
    assert caps.check(device="cpu") == ["device 'cpu' not supported (supported: cuda)"]


def test_class_paths_are_imported_lazily():
    spec = BackendSpec("A", "collections:OrderedDict")
    from collections import OrderedDict

    assert spec.load() is OrderedDict
    assert import_object("collections.OrderedDict") is OrderedDict
    with pytest.raises(ImportError, match="has no attribute 'Nope'"):
        import_object("collections:Nope")
    with pytest.raises(ValueError, match="package.module:Class"):
        import_object("nodots")


def test_builtin_backend_class_paths_resolve():
    from accel_plugin.plugins.manager import get_plugin_manager, get_registries

    registries = get_registries(get_plugin_manager({}))
    assert registries.backends.names() == ["ACCEL_FLASH", "ACCEL_PAGED"]
    for spec in registries.backends:
        assert isinstance(spec.load(), type)
