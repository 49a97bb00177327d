"""Prompt lookup (a domain with ``lookup:`` and no draft model) inside real vLLM (CPU
build): greedy outputs equal plain decoding's, and the lookup entry drafted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPTS = Path(__file__).parent / "scripts"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
K = 4
#: prompts that repeat themselves, so the context has n-gram matches; one routed elsewhere
PROMPTS = ["Rewrite: the cache is fast and the cache is small and the cache is", "Copy: a b c d a b c d a b",
           "The model is"]


def _run(target, config: Path | None, spec: dict | None) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("ACCEL_DRAFT_CONFIG", None)
    if config is not None:
        env["ACCEL_DRAFT_CONFIG"] = str(config)
    cmd = [sys.executable, str(SCRIPTS / "vllm_spec_generate.py"), str(target),
           "--batches-json", json.dumps([PROMPTS, PROMPTS[:1]]), "--max-tokens-json", json.dumps([48, 48]),
           "--spec-json", json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"vLLM failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_lookup_only_domain_gives_the_greedy_outputs_of_plain_decoding(tiny_model_dir, tmp_path,
                                                                         speculation_refusal):
    if speculation_refusal is not None:
        pytest.skip(speculation_refusal)
    target = tiny_model_dir("gqa-d64")
    config = tmp_path / "lookup.yaml"
    config.write_text(textwrap.dedent(f"""
        num_speculative_tokens: {K}
        domains:
          repeat:
            lookup: {{min: 1, max: 3}}
            match: {{keywords: [rewrite, copy]}}
        controller: {{adaptive: false}}
    """).lstrip("\n"))
    plain = _run(target, None, None)
    spec = _run(target, config, {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K})
    assert spec["token_ids"] == plain["token_ids"]
    stats = spec["accel"]
    assert stats["repeat/lookup"]["draft"] == "lookup" and stats["repeat/lookup"]["drafted"] > 0
    assert stats["repeat"]["state"] == "no-draft" and stats["default"]["drafted"] == 0
    # vLLM verified every draft; the proposer counts those whose result it saw (not a finished request's last)
    assert 0 < sum(s["drafted"] for s in stats.values()) <= spec["spec"]["num_draft_tokens"]
