"""The vLLM adapter inside one process: plugins built once, every patch undone.

Each test runs a fresh Python process (vLLM's platform classes and backend enum are
process-wide state), imports vLLM's CPU build and calls the adapter's ``register()``
as vLLM's entry point does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm


def _run(code: str, **env: str) -> dict:
    environ = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_one_plugin_manager_per_process():
    """register(), the backend classes and the proposer share one manager: entry points load once."""
    out = _run("""
        import json
        from accel_plugin.plugins import manager
        loads = []
        real = manager._installed_entry_points
        manager._installed_entry_points = lambda: loads.append(1) or real()

        import accel_plugin.adapters.vllm as adapter
        from accel_plugin.adapters.vllm import backend, proposer
        adapter.register()
        head_sizes = backend.AccelFlashBackend.get_supported_head_sizes()
        backend.AccelPagedBackend.get_supported_kernel_block_sizes()
        name, cls = proposer._core_proposer()
        from accel_plugin.adapters.vllm import _patches
        print(json.dumps({"loads": len(loads), "registered": adapter._REGISTERED, "proposer": name,
                          "sampler_fix": _patches.sampler_fix_installed(),
                          "no_draft_sampling": _patches.no_draft_sampling_installed(),
                          "proposer_class": f"{cls.__module__}.{cls.__name__}", "head_sizes": head_sizes}))
    """, ACCEL_ATTENTION_BACKEND="")
    assert out["registered"]
    assert not out["sampler_fix"], "the CPU sampler fix applies only with ACCEL_DRAFT_CONFIG set"
    assert not out["no_draft_sampling"], "the no-draft sampling applies only with ACCEL_DRAFT_CONFIG set"
    assert out["loads"] == 1, out
    assert out["proposer"] == "ACCEL_DOMAIN_DRAFT"
    assert out["proposer_class"] == "accel_plugin.speculative.proposer.DomainProposer"
    assert out["head_sizes"] == [32, 64, 80, 96, 128, 256]


def test_every_patch_in_the_ledger_is_applied_and_undone(tiny_model_dir, tmp_path):
    """With ACCEL_ATTENTION_BACKEND=flash and ACCEL_DRAFT_CONFIG on CPU: names, selector,
    CPU_ATTN override, sampler fix and no-draft sampling are applied (the target copies are not: the
    proposer's); undo_all() gives vLLM its own selection back (the names stay, inert)."""
    config = tmp_path / "drafts.yaml"
    config.write_text(f"num_speculative_tokens: 2\ndefault: {{draft: {tiny_model_dir('gqa-d32')}}}\n")
    out = _run("""
        import json
        from vllm.platforms.cpu import CpuPlatform
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        original_cpu = AttentionBackendEnum.CPU_ATTN.get_path()
        import accel_plugin.adapters.vllm as adapter
        from accel_plugin.adapters.vllm import _patches
        adapter.register()
        applied = {"names": sorted(n for n in AttentionBackendEnum.__members__ if n.startswith("ACCEL_")),
                   "selector": _patches.installed(CpuPlatform),
                   "cpu_override": _patches.cpu_override_active(),
                   "cpu_path": AttentionBackendEnum.CPU_ATTN.get_path(),
                   "sampler_fix": _patches.sampler_fix_installed(),
                   "sampler_ok": not _patches.expand_batch_to_tokens_broken(),
                   "no_draft_sampling": _patches.no_draft_sampling_installed(),
                   "target_copies": _patches.TARGET_COPIES.applied}
        _patches.undo_all()
        undone = {"selector": _patches.installed(CpuPlatform),
                  "cpu_override": _patches.cpu_override_active(),
                  "cpu_path_restored": AttentionBackendEnum.CPU_ATTN.get_path() == original_cpu,
                  "sampler_fix": _patches.sampler_fix_installed(),
                  "no_draft_sampling": _patches.no_draft_sampling_installed()}
        print(json.dumps({"applied": applied, "undone": undone, "ledger": [p.name for p in _patches.LEDGER],
                          "broken_before": broken_before}))
    """.replace("import accel_plugin.adapters.vllm as adapter",
                "from accel_plugin.adapters.vllm import _patches as p0\n"
                "        broken_before = p0.expand_batch_to_tokens_broken()\n"
                "        import accel_plugin.adapters.vllm as adapter"), ACCEL_ATTENTION_BACKEND="flash",
        ACCEL_DRAFT_CONFIG=str(config))
    assert out["ledger"][:4] == ["backend names", "selector", "CPU backend override", "CPU sampler fix"]
    # patch 4 only where vLLM's own function is broken (vLLM CPU 0.32 here), and then it works
    assert out["applied"] == {"names": ["ACCEL_FLASH", "ACCEL_PAGED"], "selector": True, "cpu_override": True,
                              "cpu_path": "accel_plugin.adapters.vllm.backend.AccelFlashBackend",
                              "sampler_fix": out["broken_before"], "sampler_ok": True,
                              "no_draft_sampling": True, "target_copies": False}
    # patch 10 is the proposer's, armed only between its construction and load_model (tests/adapters,
    # integration/test_vllm_speculative.py): register() leaves vLLM's CPU dispatch alone
    assert out["ledger"][-2:] == ["no-draft sampling", "target native copies"]
    assert out["undone"] == {"selector": False, "cpu_override": False, "cpu_path_restored": True,
                             "sampler_fix": False, "no_draft_sampling": False}


def test_the_sampler_fix_computes_what_vllm_documents():
    """expand_batch_to_tokens_torch against the docstring's example, and the probe catches a wrong one."""
    out = _run("""
        import json, torch
        from accel_plugin.adapters.vllm import _patches
        x = torch.tensor([1.5, 0.0, 3.0])
        got = _patches.expand_batch_to_tokens_torch(x, torch.tensor([2, 5, 6]), 6, replace_from=0, replace_to=7)
        wrong = lambda x, cu, n, replace_from=0, replace_to=0: torch.zeros(n)
        print(json.dumps({"got": got.tolist(), "wrong_caught": _patches.expand_batch_to_tokens_broken(wrong),
                          "right_passes": not _patches.expand_batch_to_tokens_broken(
                              _patches.expand_batch_to_tokens_torch)}))
    """)
    assert out == {"got": [1.5, 1.5, 7.0, 7.0, 7.0, 3.0], "wrong_caught": True, "right_passes": True}
