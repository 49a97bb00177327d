"""vLLM (CPU build) loads accel-plugin through its entry point, in every process."""

from __future__ import annotations

import re

import pytest

PROMPTS = ["Customer: my refund ticket", "def foo(", "The model is"]
MAX_TOKENS = 8

pytestmark = pytest.mark.vllm


def _transformers_greedy(model_dir, prompts, max_tokens):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    outs = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
        outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


@pytest.mark.parametrize("multiprocessing", ["1", "0"], ids=["multiprocess", "single-process"])
def test_entry_point_runs_in_engine_processes_and_greedy_matches(tiny_model_dir, run_vllm, multiprocessing):
    model_dir = tiny_model_dir("gqa-d32")
    result, log = run_vllm(
        model_dir, PROMPTS, env_overrides={"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing}
    )
    # vLLM loads general plugins in the driver before it configures logging, so the
    # driver's INFO line is not printed; the script reports the module state instead.
    assert result["registered_in_driver"]
    if multiprocessing == "1":
        # The engine core and worker are other processes; each logs its own line.
        pids = {int(p) for p in re.findall(r"accel-plugin loaded in process (\d+)", log)}
        assert pids - {result["pid"]}, f"register() not seen in engine processes:\n{log[-3000:]}"
    assert result["token_ids"] == _transformers_greedy(model_dir, PROMPTS, MAX_TOKENS)
