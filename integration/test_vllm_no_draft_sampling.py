"""Patch 9 of the vLLM ledger (adapters/vllm/_no_draft_sampling.py) on vLLM's own samplers.

A fresh interpreter builds vLLM's real ``RejectionSampler`` (around its real ``Sampler``,
with the CPU platform's kernels and ledger patch 4, as a CPU engine with
``ACCEL_DRAFT_CONFIG`` has them) and calls it with vLLM's
``SpecDecodeMetadata`` and ``SamplingMetadata``, once as vLLM ships it and once
patched, on the same logits and the same generator seeds: a step with no draft must
give the identical tokens through the plain sampler (greedy, seeded temperature
sampling, batch 1 to 64), and every step the patch does not own (drafts present,
logprobs asked) must reach vLLM's rejection sampling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = textwrap.dedent("""
    import json, torch
    from vllm.platforms import current_platform
    current_platform.register_triton_kernel_overrides()  # what a CPU engine does at start-up
    from vllm.v1.sample import rejection_sampler as rs_module
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from accel_plugin.adapters.vllm import _patches
    _patches.install_sampler_fix()  # patch 4, as with ACCEL_DRAFT_CONFIG (vLLM CPU 0.32's is broken)

    VOCAB = 512
    verifications = []
    real_rejection_sample = rs_module.rejection_sample
    def counting(*args, **kwargs):
        verifications.append(1)
        return real_rejection_sample(*args, **kwargs)
    rs_module.rejection_sample = counting

    def sampling(batch, temperature, logprobs=None):
        random = temperature > 0
        return SamplingMetadata(
            temperature=torch.full((batch,), temperature) if random else None,
            all_greedy=not random, all_random=random, top_p=None, top_k=None,
            generators={i: torch.Generator().manual_seed(100 + i) for i in range(batch)} if random else {},
            max_num_logprobs=logprobs, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
            repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())

    def metadata(drafts):
        md = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
        sampled = torch.tensor([len(d) + 1 for d in drafts]).cumsum(0)
        md.bonus_logits_indices = (sampled - 1).to(torch.int32)
        starts = sampled - torch.tensor([len(d) + 1 for d in drafts])
        md.target_logits_indices = torch.tensor(
            [int(s) + j for s, d in zip(starts, drafts) for j in range(len(d))], dtype=torch.int32)
        return md

    def run(drafts, temperature, logprobs=None, seed=0):
        torch.manual_seed(seed)
        logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB) * 4
        verifications.clear()
        out = RejectionSampler(Sampler())(metadata(drafts), None, logits, sampling(len(drafts), temperature, logprobs))
        lp = out.logprobs_tensors
        return {"tokens": out.sampled_token_ids.tolist(), "dtype": str(out.sampled_token_ids.dtype),
                "logprobs": None if lp is None else [None if t is None else list(t.shape) for t in lp],
                "verified": bool(verifications)}

    cases = {}
    for batch in (1, 8, 64):
        for temperature in (0.0, 0.8):
            cases[f"none b{batch} t{temperature}"] = ([[] for _ in range(batch)], temperature, None)
    cases["drafts b8 t0.0"] = ([[1, 2, 3]] + [[] for _ in range(7)], 0.0, None)
    cases["drafts b8 t0.8"] = ([[4, 5]] * 8, 0.8, None)
    cases["logprobs b8 t0.0"] = ([[] for _ in range(8)], 0.0, 2)
    vllm_own = {name: run(*case) for name, case in cases.items()}
    installed = _patches.NO_DRAFT_SAMPLING.apply() or _patches.no_draft_sampling_installed()
    patched = {name: run(*case) for name, case in cases.items()}
    _patches.NO_DRAFT_SAMPLING.revert()
    print(json.dumps({"installed": installed, "vllm": vllm_own, "patched": patched,
                      "restored": not _patches.no_draft_sampling_installed()}))
""")


def test_a_step_with_no_draft_samples_plainly_and_identically():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["restored"]
    for name, ours in out["patched"].items():
        theirs = out["vllm"][name]
        assert ours["tokens"] == theirs["tokens"] and ours["dtype"] == theirs["dtype"], name
        assert ours["logprobs"] == theirs["logprobs"], name
        assert theirs["verified"], f"{name}: vLLM's own path always verifies"
        assert ours["verified"] == (not name.startswith("none")), (
            f"{name}: the patch must skip verification exactly on steps with no draft and no logprobs")
    # the seeded temperature rows really sampled (not all the argmax)
    assert len({tuple(t) for t in out["patched"]["none b64 t0.8"]["tokens"]}) > 8


def test_the_benchmark_prints_its_table():
    """``python -m benchmarks.no_draft_sampling`` (docs/performance.md) runs and prints one row per batch."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.no_draft_sampling", "--batches", "1,3", "--calls", "3",
                           "--vocab", "1000"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert [row[0] for row in rows] == ["1", "3"] and all(len(row) == 5 for row in rows), proc.stdout
