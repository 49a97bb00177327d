"""Our backends' declared capabilities match what the kernels accept."""

import pytest
import torch

from accel_plugin.plugins.manager import get_plugin_manager, get_registries


def _caps(name="ACCEL_FLASH"):
    return get_registries(get_plugin_manager({})).backends.get(name).capabilities


def _paged_case(head_dim=32, dtype=torch.float32, block_size=16, num_heads=2, num_kv_heads=1, q_len=1,
                seq_len=1):
    """Inputs of one sequence for paged_attention and write_kv_cache (the cache reached by
    the block table holds ``seq_len`` tokens)."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    blocks = -(-seq_len // block_size)
    k_cache, v_cache = (randn(blocks, block_size, num_kv_heads, head_dim) for _ in range(2))
    return dict(q=randn(q_len, num_heads, head_dim), k_cache=k_cache, v_cache=v_cache,
                cu_seqlens_q=torch.tensor([0, q_len], dtype=torch.int32),
                seq_lens=torch.tensor([seq_len], dtype=torch.int32),
                block_table=torch.arange(blocks, dtype=torch.int32)[None], max_seqlen_q=q_len, max_seq_len=seq_len)


def _run_kernels(case, **options):
    """Run both attention kernels and the KV-cache write on ``case``; each result must equal
    the float64 reference (so "accepted" means "computes", not only "passes validation")."""
    from accel_plugin import kernels

    reference = kernels.reference
    out = kernels.paged_attention(**case, **options)
    wide = {k: (v.double() if v.is_floating_point() else v) if isinstance(v, torch.Tensor) else v
            for k, v in case.items()}
    torch.testing.assert_close(out.double(), reference.paged_attention(**wide, **options), atol=2e-2, rtol=0)
    q, k, v = case["q"], case["k_cache"][0, :1], case["v_cache"][0, :1]
    cu = torch.tensor([0, 1], dtype=torch.int32)
    flash = kernels.flash_attn_varlen_func(q[:1], k, v, cu, cu, 1, 1, **options)
    torch.testing.assert_close(flash.double(), v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1),
                               atol=1e-2, rtol=0)  # one key: the output is its value
    kernels.write_kv_cache(k, v, case["k_cache"].clone(), case["v_cache"].clone(), torch.tensor([0]))


def _refusal(case) -> str | None:
    """The kernels' refusal of ``case`` (paged attention and the KV-cache write), or None."""
    from accel_plugin import kernels

    messages = []
    for call in (lambda: kernels.paged_attention(**case),
                 lambda: kernels.write_kv_cache(case["k_cache"][0, :1], case["v_cache"][0, :1], case["k_cache"],
                                                case["v_cache"], torch.tensor([0]))):
        try:
            call()
        except ValueError as exc:
            messages.append(str(exc))
    return " | ".join(messages) or None


def test_every_declared_head_size_runs_and_every_other_is_refused_by_the_kernels():
    caps = _caps()
    for head_dim in caps.head_sizes:
        _run_kernels(_paged_case(head_dim=head_dim))
    declared = [h for h in range(1, 520) if not caps.check(head_size=h)]
    assert declared == sorted(caps.head_sizes)
    for head_dim in sorted({1, 8, 16, 31, 33, 48, 72, 100, 127, 129, 192, 255, 257, 512} - set(declared)):
        refusal = _refusal(_paged_case(head_dim=head_dim))
        assert refusal is not None and "head_dim must be one of" in refusal, head_dim


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_a_dtype_is_declared_exactly_when_the_kernels_run_it(dtype):
    name = str(dtype).removeprefix("torch.")
    case = _paged_case(dtype=dtype)
    if _caps().check(dtype=name):
        refusal = _refusal(case)
        assert refusal is not None and "dtype must be one of" in refusal
    else:
        _run_kernels(case)


def test_every_declared_block_size_runs_and_the_sizes_outside_the_range_are_refused():
    caps = _caps()
    for block_size in caps.block_sizes:
        _run_kernels(_paged_case(block_size=block_size, seq_len=block_size + 1))
    for block_size in (min(caps.block_sizes) - 1, max(caps.block_sizes) + 1, 8):
        assert caps.check(block_size=block_size)
        refusal = _refusal(_paged_case(block_size=block_size))
        assert refusal is not None and "block_size" in refusal, block_size


def test_every_declared_feature_is_one_the_kernels_compute():
    features = _caps().features
    computed = {
        "sliding_window": dict(case=dict(q_len=3, seq_len=40), options=dict(window_size=(7, 0))),
        "softcap": dict(case={}, options=dict(softcap=2.0)),
        "gqa": dict(case=dict(num_heads=4, num_kv_heads=2), options={}),
        # these three read cached context: several queries over a longer sequence
        "chunked_prefill": dict(case=dict(q_len=5, seq_len=37), options={}),
        "prefix_caching": dict(case=dict(q_len=9, seq_len=33), options={}),
        "spec_decode": dict(case=dict(q_len=4, seq_len=21), options={}),
    }
    assert features == set(computed), f"declared features without a check here: {set(features) ^ set(computed)}"
    for feature in sorted(features):
        _run_kernels(_paged_case(**computed[feature]["case"]), **computed[feature]["options"])
    assert _caps().check(features=("alibi",)) == ["feature 'alibi' not supported"]


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


def test_reading_the_limits_imports_neither_torch_nor_triton():
    import subprocess
    import sys

    code = ("import sys; import accel_plugin.plugins.builtin, accel_plugin.kernels.limits; "
            "print(sorted({'torch', 'triton'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
