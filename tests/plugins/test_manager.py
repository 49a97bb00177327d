import logging

import pluggy
import pytest

from accel_plugin import envs
from accel_plugin.plugins.manager import PluginLoadError, get_plugin_manager, get_registries, plugin_names


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
    with caplog.at_level(logging.DEBUG, logger="accel_plugin.plugins.manager"):
        get_registries(pm)
    assert any("accel_register_attention_backends" in r.getMessage() for r in caplog.records)


def test_manager_is_not_built_at_import():
    import accel_plugin.plugins.manager as manager

    assert not any(isinstance(v, pluggy.PluginManager) for v in vars(manager).values())


def test_own_adapter_hooks_always_load_and_answer_for_their_framework():
    """The vLLM adapter is a plugin of the core (its own entry point), unaffected by
    the third-party allowlist; the core reaches its demo runner only through a hook."""
    for environ in ({}, {envs.ACCEL_PLUGINS: ""}):
        pm = get_plugin_manager(environ)
        assert "accel.vllm" in plugin_names(pm)
        harness = pm.hook.accel_demo_harness(framework="vllm")
        assert f"{harness.__module__}.{harness.__name__}" == "accel_plugin.adapters.vllm.demo.run_side_by_side"
        assert pm.hook.accel_demo_harness(framework="tgi") is None


def test_process_plugins_are_built_once(monkeypatch):
    import accel_plugin.plugins.manager as manager

    loads = []
    real = manager._installed_entry_points
    monkeypatch.setattr(manager, "_installed_entry_points", lambda: loads.append(1) or real())
    manager.reset_process_plugins()
    try:
        first = manager.process_plugins()
        assert manager.process_plugins() is first
        assert first.components("vllm") is first.components("vllm")
        assert len(loads) == 1
    finally:
        manager.reset_process_plugins()


def test_components_must_name_registered_proposers_for_the_framework(plugin_distribution):
    from accel_plugin.plugins.manager import load_plugins
    from accel_plugin.plugins.registry import UnknownNameError

    plugin_distribution("offers_unknown", (
        "from accel_plugin import hookimpl\n"
        "@hookimpl\n"
        "def accel_adapter_components(components):\n"
        "    components.proposers.append('NOPE')\n"
    ), "offers_unknown")
    with pytest.raises(UnknownNameError, match="unknown proposer 'NOPE'; known proposers: ACCEL_DOMAIN_DRAFT"):
        load_plugins({}).components("vllm")


def test_components_refuse_a_proposer_not_made_for_the_framework():
    from accel_plugin.plugins.manager import load_plugins

    from accel_plugin import hookimpl

    plugins = load_plugins({})
    assert plugins.components("vllm").proposers == ["ACCEL_DOMAIN_DRAFT"]
    assert plugins.components("tgi").proposers == ["ACCEL_DOMAIN_DRAFT"]

    class Offer:
        @staticmethod
        @hookimpl
        def accel_adapter_components(components):
            components.proposers.append("ACCEL_DOMAIN_DRAFT")

    plugins = load_plugins({})
    plugins.pm.register(Offer, name="offer-to-sglang")
    with pytest.raises(ValueError, match="offered to sglang but declares frameworks vllm, tgi"):
        plugins.components("sglang")


def test_an_adapter_gets_its_proposer_from_the_registry_or_a_clear_error():
    from accel_plugin.plugins.manager import NoProposerError, load_plugins
    from accel_plugin.speculative import DomainProposer

    plugins = load_plugins({})
    assert plugins.proposer("vllm") == ("ACCEL_DOMAIN_DRAFT", DomainProposer)
    with pytest.raises(NoProposerError, match="no accel plugin offers a speculative proposer to SGLang .*"
                                              "registered proposers: ACCEL_DOMAIN_DRAFT"):
        plugins.proposer("sglang", display="SGLang")
