import logging

import pluggy
import pytest

from accel_plugin import envs
from accel_plugin.manager import PluginLoadError, get_plugin_manager, get_registries, plugin_names


def test_default_plugins_register_through_the_hooks():
    pm = get_plugin_manager({})
    assert "accel.builtin" in plugin_names(pm)
    registries = get_registries(pm)
    assert "ACCEL_FLASH" in registries.backends and "ACCEL_PAGED" in registries.backends


def test_third_party_entry_point_adds_a_backend(third_party_plugin):
    pm = get_plugin_manager({})
    assert "third_party" in plugin_names(pm)
    spec = get_registries(pm).backends.get("THIRD_PARTY_ATTN")
    assert spec.description == "registered by a third-party plugin"


def test_allowlist_filters_entry_points(third_party_plugin):
    pm = get_plugin_manager({envs.ACCEL_PLUGINS: ""})
    assert "third_party" not in plugin_names(pm)
    assert "THIRD_PARTY_ATTN" not in get_registries(pm).backends
    pm = get_plugin_manager({envs.ACCEL_PLUGINS: "third_party"})
    assert "THIRD_PARTY_ATTN" in get_registries(pm).backends


def test_allowlist_naming_a_missing_plugin_fails(third_party_plugin):
    with pytest.raises(PluginLoadError) as info:
        get_plugin_manager({envs.ACCEL_PLUGINS: "third_party,nope"})
    assert "not installed: nope" in str(info.value)
    assert "installed accel plugins: third_party" in str(info.value)


def test_hook_implementation_without_spec_is_rejected(plugin_distribution):
    source = (
        "from accel_plugin import hookimpl\n"
        "@hookimpl\n"
        "def accel_register_backends(registry):  # misspelt hook name\n"
        "    pass\n"
    )
    plugin_distribution("misspelt_accel", source, "misspelt")
    with pytest.raises(pluggy.PluginValidationError, match="accel_register_backends"):
        get_plugin_manager({})


def test_plugin_that_fails_to_import_is_reported(plugin_distribution):
    plugin_distribution("broken_accel", "raise RuntimeError('boom')\n", "broken")
    with pytest.raises(PluginLoadError, match="'broken'.*failed to import.*boom"):
        get_plugin_manager({})


def test_trace_logs_hook_calls(caplog):
    pm = get_plugin_manager({envs.ACCEL_TRACE: "1"})
    with caplog.at_level(logging.DEBUG, logger="accel_plugin.manager"):
        get_registries(pm)
    assert any("accel_register_attention_backends" in r.getMessage() for r in caplog.records)


def test_manager_is_not_built_at_import():
    import accel_plugin.manager as manager

    assert not any(isinstance(v, pluggy.PluginManager) for v in vars(manager).values())
