"""Contract tests of the TGI adapter against a fake ``text_generation_server``.

TGI's server is not on PyPI and needs torch + IPEX (a 6 GB environment), so these
tests build a fake package tree in ``tmp_path`` with the module names, import
structure and function signatures of TGI v3.3.7 (attention package re-exporting
``ipex.attention``/``paged_attention``, modeling modules importing them by name,
``models/globals.py`` reading ``ATTENTION``, the IPEX-on-CPU KV layout
``[num_blocks, num_kv_heads, BLOCK_SIZE, head_size]``). The fake's own attention is
a plain-torch reference that reads the cache. integration/test_tgi_attention.py runs
the real TGI.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from accel_plugin.adapters import tgi
from accel_plugin.adapters.tgi import _compat, _names, _patches
from accel_plugin.adapters.tgi import attention as accel_attention

from accel_plugin import envs
from accel_plugin.attention import UnsupportedAttentionConfig

IMPORTS = "from text_generation_server.layers.attention import KVCache, Seqlen, attention, paged_attention\n"

FAKE_TGI = {
    "__init__.py": "",
    "utils/__init__.py": "",
    "utils/import_utils.py": 'SYSTEM = "ipex"\n',
    "models/__init__.py": "",
    "models/globals.py": """
        import os
        ATTENTION = os.environ["ATTENTION"]
        BLOCK_SIZE = {"paged": 16, "flashdecoding-ipex": 64, "flashdecoding": 256, "flashinfer": 1}[ATTENTION]
    """,
    "layers/__init__.py": "",
    "layers/attention/__init__.py": """
        from .common import Seqlen
        from .ipex import SUPPORTS_WINDOWING, attention, paged_attention
        from .kv_cache import KVCache
    """,
    "layers/attention/common.py": """
        import torch

        class Seqlen:
            def __init__(self, input_lengths, cache_lengths, cu_seqlen_q=None, max_q=None, max_k=None):
                self.input_lengths, self.cache_lengths = input_lengths, cache_lengths
                if cu_seqlen_q is None:
                    cu_seqlen_q = torch.arange(input_lengths.shape[0] + 1, dtype=torch.int32)
                    max_q = 1
                self.cu_seqlen_q, self.max_q, self.max_k = cu_seqlen_q, max_q, max_k
    """,
    "layers/attention/kv_cache.py": """
        import torch
        from text_generation_server.models.globals import BLOCK_SIZE

        class KVCache:
            def __init__(self, *, num_blocks, num_heads, head_size, dtype, device):
                shape = (num_blocks, num_heads, BLOCK_SIZE, head_size)
                self.kv_cache = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
            key = property(lambda self: self.kv_cache[0])
            value = property(lambda self: self.kv_cache[1])
            def store(self, *, key, value, slots, kv_scales=None):
                blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
                self.kv_cache[0][blocks, :, offsets] = key.to(self.kv_cache[0].dtype)
                self.kv_cache[1][blocks, :, offsets] = value.to(self.kv_cache[1].dtype)
    """,
    "layers/attention/ipex.py": """
        import torch
        from text_generation_server.models.globals import BLOCK_SIZE
        SUPPORTS_WINDOWING = False
        CALLS = []

        def _reference(query, kv_cache, block_tables, seqlen, softmax_scale):
            out = torch.empty_like(query)
            cu = seqlen.cu_seqlen_q.tolist()
            lens = (seqlen.input_lengths + seqlen.cache_lengths).tolist()
            group = query.shape[1] // kv_cache.key.shape[1]
            for b, length in enumerate(lens):
                pos = torch.arange(length)
                blocks = block_tables[b, pos // BLOCK_SIZE].long()
                k = kv_cache.key[blocks, :, pos % BLOCK_SIZE].float().repeat_interleave(group, 1)
                v = kv_cache.value[blocks, :, pos % BLOCK_SIZE].float().repeat_interleave(group, 1)
                q = query[cu[b]:cu[b + 1]].float()
                scores = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
                first = length - q.shape[0]
                mask = pos[None, :] > (first + torch.arange(q.shape[0]))[:, None]
                probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
                out[cu[b]:cu[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
            return out

        def attention(*, query, key, value, kv_cache, kv_scales, seqlen, block_tables, softmax_scale,
                      window_size_left=-1, causal=True, softcap=None):
            CALLS.append("attention")
            return _reference(query, kv_cache, block_tables, seqlen, softmax_scale)

        def paged_attention(query, kv_cache, kv_head_mapping, softmax_scale, block_tables, seqlen, max_s,
                            *, kv_scales, softcap=None, window_size_left=-1):
            CALLS.append("paged_attention")
            return _reference(query, kv_cache, block_tables, seqlen, softmax_scale)
    """,
    "models/custom_modeling/__init__.py": "",
    "models/custom_modeling/flash_llama_modeling.py": IMPORTS,
    "models/custom_modeling/flash_mistral_modeling.py": IMPORTS,
    "models/transformers_flash_causal_lm.py": (
        "from text_generation_server.layers.attention import attention as tgi_attention, paged_attention\n"
    ),
    "models/flash_causal_lm.py": "from text_generation_server.layers.attention import Seqlen\n",
}

PKG = "text_generation_server"
LLAMA = f"{PKG}.models.custom_modeling.flash_llama_modeling"
MISTRAL = f"{PKG}.models.custom_modeling.flash_mistral_modeling"
TRANSFORMERS = f"{PKG}.models.transformers_flash_causal_lm"


def write_fake_tgi(root, overrides=None):
    for rel, source in {**FAKE_TGI, **(overrides or {})}.items():
        path = root / PKG / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def _forget_tgi():
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
        del sys.modules[name]


@pytest.fixture
def fake_tgi(tmp_path, monkeypatch):
    """Factory: ``fake_tgi(attention="paged", backend="flash", overrides=None)`` puts a fresh fake
    TGI first on sys.path and sets the variables; the adapter is uninstalled afterwards."""

    def make(attention="paged", backend="flash", overrides=None, version=_compat.TESTED_VERSIONS[0].split()[0]):
        # the fake has no package metadata: it reports the version the test names
        monkeypatch.setattr(_compat, "TGI_VERSION", version)
        monkeypatch.setenv("ATTENTION", attention)
        if backend is None:
            monkeypatch.delenv(envs.ACCEL_ATTENTION_BACKEND, raising=False)
        else:
            monkeypatch.setenv(envs.ACCEL_ATTENTION_BACKEND, backend)
        root = tmp_path / f"fake-{attention}"
        write_fake_tgi(root, overrides)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        _forget_tgi()
        return root

    yield make
    tgi.uninstall()
    _forget_tgi()
    accel_attention.reset()


def our_finders():
    return [f for f in sys.meta_path if getattr(f, "owner", None) == _names.HOOK_OWNER]


def imp(name):
    return importlib.import_module(name)


def test_hook_rebinds_the_package_and_every_by_name_copy_including_later_imports(fake_tgi):
    fake_tgi()
    tgi.install_import_hook()
    llama = imp(LLAMA)
    package, ipex = imp(f"{PKG}.layers.attention"), imp(f"{PKG}.layers.attention.ipex")
    assert package.attention is accel_attention.attention
    assert package.paged_attention is accel_attention.paged_attention
    assert llama.attention is accel_attention.attention and llama.paged_attention is accel_attention.paged_attention
    assert ipex.attention.__module__ == ipex.__name__  # the home module keeps TGI's own
    mistral, transformers = imp(MISTRAL), imp(TRANSFORMERS)  # imported after activation
    assert mistral.attention is accel_attention.attention
    assert transformers.tgi_attention is accel_attention.attention  # under an alias
    assert accel_attention.current().backend == "ACCEL_FLASH"
    rebound = _patches.ATTENTION_FUNCTIONS.rebound_modules()
    assert rebound[0] == f"{PKG}.layers.attention" and {LLAMA, MISTRAL, TRANSFORMERS} <= set(rebound)


def test_activation_after_tgi_was_imported_rebinds_the_existing_copies(fake_tgi):
    fake_tgi()
    llama = imp(LLAMA)
    original = llama.attention
    assert not tgi.is_active()
    tgi.install_import_hook()  # e.g. from a script that imported TGI first
    assert llama.attention is accel_attention.attention
    tgi.uninstall()
    assert llama.attention is original


def test_unset_variable_means_no_patch_at_all(fake_tgi):
    fake_tgi(backend=None)
    tgi.install_import_hook()
    llama = imp(LLAMA)
    assert not tgi.is_active()
    assert llama.attention.__module__.endswith(".ipex")
    assert accel_attention.current() is None


def test_install_is_idempotent_and_activate_switches_the_backend(fake_tgi):
    fake_tgi()
    tgi.install_import_hook()
    tgi.install_import_hook()
    imp(LLAMA)
    records = len(_patches.ATTENTION_FUNCTIONS._records)
    assert tgi.activate() == "ACCEL_FLASH"
    assert len(our_finders()) == 1 and len(_patches.ATTENTION_FUNCTIONS._records) == records
    assert tgi.activate("paged") == "ACCEL_PAGED"
    assert accel_attention.current().backend == "ACCEL_PAGED"
    assert len(_patches.ATTENTION_FUNCTIONS._records) == records


def test_uninstall_restores_every_original_and_removes_the_hook(fake_tgi):
    fake_tgi()
    tgi.install_import_hook()
    llama, mistral, transformers = imp(LLAMA), imp(MISTRAL), imp(TRANSFORMERS)
    ipex = imp(f"{PKG}.layers.attention.ipex")
    tgi.uninstall()
    package = imp(f"{PKG}.layers.attention")
    for module, attr in ((package, "attention"), (package, "paged_attention"), (llama, "attention"),
                         (llama, "paged_attention"), (mistral, "attention"), (transformers, "tgi_attention")):
        assert getattr(module, attr) is getattr(ipex, attr.replace("tgi_", "")), (module.__name__, attr)
    assert our_finders() == [] and _patches.applied() == []
    assert accel_attention.current() is None
    tgi.uninstall()  # twice is fine
    sys.modules.pop(MISTRAL)
    assert imp(MISTRAL).attention is ipex.attention  # imported after uninstall: TGI's own


def test_every_ledger_entry_is_documented_and_undone(fake_tgi):
    """The attention variable applies the attention patches (the speculation entries are
    covered by test_tgi_spec_contract.py); every entry is documented."""
    fake_tgi()
    tgi.install_import_hook()
    imp(LLAMA)
    assert [p.name for p in _patches.applied()] == [p.name for p in _patches.ATTENTION_PATCHES]
    for patch in _patches.LEDGER:
        assert patch.target and patch.why and patch.undo and patch.upstream
        assert f"The {patch.name}" in _patches.__doc__  # a section of the ledger
    tgi.uninstall()
    assert not any(p.applied for p in _patches.LEDGER)


def test_a_bad_value_is_refused_when_tgi_imports_its_attention(fake_tgi):
    fake_tgi(backend="fastest")
    tgi.install_import_hook()
    with pytest.raises(envs.EnvVarError, match="flash, paged, auto"):
        imp(LLAMA)
    assert not tgi.is_active() and accel_attention.current() is None


@pytest.mark.parametrize("mode", ["flashdecoding", "flashinfer"])
def test_unsupported_attention_modes_are_refused_at_start_up(fake_tgi, mode):
    fake_tgi(attention=mode)
    tgi.install_import_hook()
    with pytest.raises(UnsupportedAttentionConfig) as info:
        imp(LLAMA)
    message = str(info.value)
    assert f"ATTENTION={mode}" in message and "paged, flashdecoding-ipex" in message
    assert "unset ACCEL_ATTENTION_BACKEND" in message
    assert not tgi.is_active()


def test_a_changed_tgi_signature_is_refused(fake_tgi):
    ipex = FAKE_TGI["layers/attention/ipex.py"].replace("seqlen, max_s,", "seqlen, max_s, extra,")
    fake_tgi(overrides={"layers/attention/ipex.py": ipex})
    tgi.install_import_hook()
    with pytest.raises(RuntimeError, match="not supported yet"):
        imp(LLAMA)
    assert not tgi.is_active()


# --- what our functions compute: the Seqlen/block_tables mapping against the fake's reference ---

NUM_BLOCKS, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 24, 4, 2, 64


def _step(modules, contexts, q_lens, *, decode_rows=False, seed=0):
    """A KV cache holding ``contexts`` (tokens per sequence, this step's included), stored
    through TGI's ``KVCache.store`` at shuffled blocks, and this step's tensors."""
    torch.manual_seed(seed)
    block_size = modules.globals.BLOCK_SIZE
    kv_cache = modules.kv.KVCache(num_blocks=NUM_BLOCKS, num_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                                  dtype=torch.float32, device=torch.device("cpu"))
    per_seq = max(-(-c // block_size) for c in contexts)
    blocks = torch.randperm(NUM_BLOCKS)[: per_seq * len(contexts)].view(len(contexts), per_seq).to(torch.int32)
    keys, values = [], []
    for b, length in enumerate(contexts):
        k, v = torch.randn(length, NUM_KV_HEADS, HEAD_SIZE), torch.randn(length, NUM_KV_HEADS, HEAD_SIZE)
        pos = torch.arange(length)
        kv_cache.store(key=k, value=v, slots=blocks[b, pos // block_size].long() * block_size + pos % block_size)
        keys.append(k[length - q_lens[b]:])
        values.append(v[length - q_lens[b]:])
    q_lens_t = torch.tensor(q_lens, dtype=torch.int32)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(q_lens_t, 0)
    seqlen = modules.common.Seqlen(
        input_lengths=q_lens_t, cache_lengths=torch.tensor(contexts, dtype=torch.int32) - q_lens_t,
        cu_seqlen_q=None if decode_rows else cu, max_q=max(q_lens), max_k=1,  # max_k deliberately wrong
    )
    query = torch.randn(int(cu[-1]), NUM_HEADS, HEAD_SIZE)
    return kv_cache, seqlen, blocks, query, torch.cat(keys), torch.cat(values)


def _modules():
    import types

    return types.SimpleNamespace(
        globals=imp(f"{PKG}.models.globals"), kv=imp(f"{PKG}.layers.attention.kv_cache"),
        common=imp(f"{PKG}.layers.attention.common"), ipex=imp(f"{PKG}.layers.attention.ipex"),
    )


GQA_MAPPING = torch.arange(NUM_KV_HEADS, dtype=torch.int32).repeat_interleave(NUM_HEADS // NUM_KV_HEADS)


@pytest.mark.parametrize("mode", ["paged", "flashdecoding-ipex"])
@pytest.mark.parametrize("backend", ["flash", "paged"])
def test_our_functions_match_tgi_semantics(fake_tgi, mode, backend):
    fake_tgi(attention=mode, backend=backend)
    tgi.install_import_hook()
    imp(LLAMA)
    m = _modules()
    scale = HEAD_SIZE ** -0.5
    # Prefill: fresh prompts of odd lengths next to a chunked-prefill continuation and a decode row.
    kv_cache, seqlen, blocks, query, key, value = _step(m, contexts=[1, 17, 70, 33], q_lens=[1, 17, 6, 1])
    got = accel_attention.attention(query=query, key=key, value=value, kv_cache=kv_cache, kv_scales=None,
                                    seqlen=seqlen, block_tables=blocks, softmax_scale=scale)
    want = m.ipex.attention(query=query, key=key, value=value, kv_cache=kv_cache, kv_scales=None, seqlen=seqlen,
                            block_tables=blocks, softmax_scale=scale)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # Decode rows, as speculative verification lays them out: one sequence per row.
    contexts = [40, 41, 42, 5, 6, 7]
    kv_cache, seqlen, blocks, query, _, _ = _step(m, contexts=contexts, q_lens=[1] * 6, decode_rows=True, seed=1)
    got = accel_attention.paged_attention(query, kv_cache, GQA_MAPPING, scale, blocks, seqlen, 7, kv_scales=None)
    want = m.ipex.paged_attention(query, kv_cache, GQA_MAPPING, scale, blocks, seqlen, 7, kv_scales=None)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    calls = accel_attention.call_counts()
    assert calls["attention"] == 1 and calls["paged_attention"] == 1
    assert calls["both_kernels"] == (1 if backend == "flash" else 0)
    assert m.ipex.CALLS == ["attention", "paged_attention"]  # only the reference calls above


def _refusal(fake_tgi, **call):
    fake_tgi()
    tgi.install_import_hook()
    imp(LLAMA)
    m = _modules()
    kv_cache, seqlen, blocks, query, _, _ = _step(m, contexts=[3, 5], q_lens=[1, 1], decode_rows=True)
    args = {"query": query, "kv_cache": kv_cache, "kv_head_mapping": GQA_MAPPING, "softmax_scale": 0.125,
            "block_tables": blocks, "seqlen": seqlen, "max_s": 5, "kv_scales": None, **call}
    with pytest.raises(UnsupportedAttentionConfig) as info:
        accel_attention.paged_attention(**args)
    assert "unset ACCEL_ATTENTION_BACKEND" in str(info.value)
    return str(info.value)


def test_refuses_a_quantized_kv_cache(fake_tgi):
    class Fp8Cache:
        key = value = torch.zeros(4, NUM_KV_HEADS, 16, HEAD_SIZE, dtype=torch.float8_e5m2)

    assert "fp8" in _refusal(fake_tgi, kv_cache=Fp8Cache())


def test_refuses_sliding_windows(fake_tgi):
    assert "window_size_left=4095" in _refusal(fake_tgi, window_size_left=4095)


def test_refuses_a_non_standard_kv_head_mapping(fake_tgi):
    assert "kv_head_mapping" in _refusal(fake_tgi, kv_head_mapping=GQA_MAPPING.flip(0))


def test_refuses_unsupported_head_sizes(fake_tgi):
    assert "head size 16" in _refusal(fake_tgi, query=torch.randn(2, NUM_HEADS, 16))


@pytest.mark.parametrize("version", ["2.0.4", "3.0.0", "unknown"])
def test_unsupported_tgi_version_is_refused_naming_the_range(fake_tgi, version):
    from accel_plugin.versions import UnsupportedFrameworkVersion

    fake_tgi(version=version)
    tgi.install_import_hook()
    with pytest.raises(UnsupportedFrameworkVersion) as err:
        imp(f"{PKG}.layers.attention")
    message = str(err.value)
    assert "supports TGI's server (text-generation-server) ==2.0.5.dev0" in message
    assert f"this is TGI's server (text-generation-server) {version}" in message
    assert "unset ACCEL_ATTENTION_BACKEND" in message
    assert not _patches.ATTENTION_FUNCTIONS.applied
