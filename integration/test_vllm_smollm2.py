"""accel attention backends inside real vLLM (CPU build) on a real model no one here
wrote: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 KV heads, head_dim 64,
float32), from ``accel_plugin.models.store`` (``make models`` fetches it; the tests
skip when it is not in the cache and never download).

Greedy generation (``ignore_eos``) of chat-templated prompts in one batch, three
times, each in a vLLM process of its own (``ACCEL_ATTENTION_BACKEND`` is read once
per process): unset (vLLM's own ``CPU_ATTN``), ``flash`` and ``paged``. The token ids
must be identical, and the attention backend of every layer is read back from the
worker (``attention_backends``) and from the backend's INFO line.

What runs where: on CPU the accel backends run their kernels' torch CPU path
(``accel_plugin.kernels.cpu_attention``; the INFO line says so), not the Triton
interpreter that the tiny-model tests use (conftest.py sets ``TRITON_INTERPRET=1``;
it is removed for these subprocesses). The interpreter took 229 s for the short
case's ``flash`` run alone on 2 CPU cores, too slow for CI. So this shows the vLLM
integration on a real model: selection by the variable, vLLM's metadata turned into
a plan (fresh prompts to the flash path, cache reads to the paged path), the KV cache
written and read in the backend's own layout, GQA 9/3, chunked prefill and prefix
caching (slow case). The Triton kernels themselves are checked against the same
reference in tests/ and inside vLLM on tiny models (test_vllm_attention.py); with
CUDA tensors these backends run the compiled kernels.

Block size 32: vLLM's CPU_ATTN accepts multiples of 32 only, and the comparison
needs the same cache geometry on both sides.
"""

from __future__ import annotations

import json
import re

import pytest

from accel_plugin.models import store as model_store

pytestmark = pytest.mark.vllm

#: label -> ACCEL_ATTENTION_BACKEND (None: unset); "stock" is the reference.
CONFIGS = {"stock": None, "ACCEL_FLASH": "flash", "ACCEL_PAGED": "paged"}
STOCK_BACKEND = "CPU_ATTN"
ENGINE = {
    "enforce_eager": True,
    "max_model_len": 512,
    "kv_cache_memory_bytes": 128 * 2**20,
    "max_num_seqs": 16,
    "block_size": 32,
}
#: One process per engine; no Triton interpreter (see the module docstring).
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TRITON_INTERPRET": None}
#: Top logprobs returned per step: shown when a token differs.
LOGPROBS = 2

SUPPORT = ("My order #4821 arrived with a cracked screen and the box was dented. I want a "
           "replacement, not a refund. What should I do, and how long will it take?")
CODE = "Write a Python function that returns the n-th Fibonacci number."
#: Chat-templated with the model's default system prompt: 32, 36, 44 and 70 tokens
#: (exactly one block, just over one, two and three blocks).
SHORT_QUESTIONS = ["Hi!", "Why is the sky blue?", CODE, SUPPORT]
SHORT_MAX_TOKENS = 20

SHOP = ("You are the support assistant of Northwind Outfitters, an online shop for hiking and "
        "camping gear. Answer politely and concisely. Orders ship within two business days; "
        "returns are accepted within 30 days with the receipt; damaged items are replaced free "
        "of charge. Never ask for a customer's password or full card number.")
PARAGRAPH = ("The Pacific Crest Trail runs 4,265 kilometres from the Mexican border to Canada, "
             "through deserts, the Sierra Nevada and the Cascade Range. Most hikers walk it "
             "northbound between April and September, carrying food for up to ten days between "
             "resupply towns. Snow in the high Sierra and wildfires in Oregon and Washington "
             "force many to change their plans; only about a quarter of those who start each "
             "year reach the northern terminus.")
#: Eight conversations of 32 to 141 tokens; three share their first 74 tokens (the
#: shop's system prompt: two full blocks), which the warm-up puts in the prefix cache.
LONG_CONVERSATIONS = [
    [{"role": "system", "content": SHOP}, {"role": "user", "content": "Where is my order #5512? I placed it nine days ago."}],
    [{"role": "system", "content": SHOP},
     {"role": "user", "content": "Can I return a tent I used once? It leaks at the seams."}],
    [{"role": "system", "content": SHOP},
     {"role": "user", "content": "Hello, my sleeping bag's zip broke on the first night."},
     {"role": "assistant", "content": "I'm sorry to hear that. Could you tell me your order number?"},
     {"role": "user", "content": "It is 7730. I bought it three weeks ago. Can you send a new one?"}],
    [{"role": "user", "content": "Write a Python function that checks whether a string is a "
                                 "palindrome, ignoring case and punctuation."}],
    [{"role": "user", "content": "Explain the difference between a list and a tuple in Python."}],
    [{"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Summarise the following paragraph in two sentences.\n\n" + PARAGRAPH}],
    [{"role": "user", "content": "What are three tips for sleeping well before a long hike?"}],
]
LONG_WARMUP = [[{"role": "system", "content": SHOP}, {"role": "user", "content": "Hello."}]]
LONG_MAX_TOKENS = 96
#: A 64-token step budget: the longer prompts are prefilled in chunks, mixed with
#: other requests' decodes.
LONG_ENGINE = {"max_num_batched_tokens": 64, "enable_chunked_prefill": True, "enable_prefix_caching": True}


@pytest.fixture(scope="module")
def smollm2_dir():
    path = model_store.cached_path("smollm2")
    if path is None:
        pytest.skip("SmolLM2-135M-Instruct is not in the model cache "
                    f"({model_store.models_dir()}); run `make models` to fetch it")
    return path


@pytest.fixture(scope="module")
def chat_prompts(smollm2_dir):
    """``chat_prompts(conversations)`` -> vLLM prompts: the model's chat template applied
    (with the generation prompt) by its own tokenizer, as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    def build(conversations):
        return [
            {"prompt_token_ids": list(tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False))}
            for messages in conversations
        ]

    return build


def generate_all(run_vllm, model_dir, prompts, *, max_tokens, engine_kwargs=None, extra_args=()):
    """One vLLM process per entry of CONFIGS; returns {label: result with its "log"}."""
    runs = {}
    for label, setting in CONFIGS.items():
        result, log = run_vllm(
            model_dir, prompts, max_tokens=max_tokens,
            env_overrides={**ENV, "ACCEL_ATTENTION_BACKEND": setting},
            engine_kwargs={**ENGINE, **(engine_kwargs or {})},
            extra_args=["--logprobs", str(LOGPROBS), *extra_args],
        )
        runs[label] = {**result, "log": log}
    return runs


def assert_backends_read_back(runs):
    assert runs["stock"]["attention_backends"] == [STOCK_BACKEND]
    assert "attention backend (accel-plugin)" not in runs["stock"]["log"]
    for label in CONFIGS:
        if label == "stock":
            continue
        assert runs[label]["attention_backends"] == [label], (label, runs[label]["attention_backends"])
        line = re.search(rf"Using {label} attention backend \(accel-plugin\) in process \d+; "
                         r"kernels: (.*)", runs[label]["log"])
        assert line, f"{label}: no INFO line naming the backend:\n{runs[label]['log'][-3000:]}"
        assert "TRITON_INTERPRET=1" not in line.group(1), line.group(0)
        assert "native C++ CPU kernel (paged decode, OpenMP) + torch CPU path" in line.group(1), line.group(0)


def assert_same_tokens(runs, max_tokens):
    """Token for token equal to "stock"; a difference names the first position and both
    runs' top logprobs there."""
    want = runs["stock"]
    for label, run in runs.items():
        for i, (got, expected) in enumerate(zip(run["token_ids"], want["token_ids"], strict=True)):
            assert len(got) == max_tokens, (label, i, len(got))
            if got == expected:
                continue
            pos = next(j for j, (a, b) in enumerate(zip(got, expected)) if a != b)
            pytest.fail(
                f"{label}, prompt {i}: first different token at position {pos}: {got[pos]} vs "
                f"stock {expected[pos]}; top logprobs there: {label} {run['logprobs'][i][pos]}, "
                f"stock {want['logprobs'][i][pos]}; the {pos} tokens before agree"
            )


def test_greedy_chat_matches_stock(smollm2_dir, chat_prompts, run_vllm):
    prompts = chat_prompts([[{"role": "user", "content": q}] for q in SHORT_QUESTIONS])
    assert len({len(p["prompt_token_ids"]) for p in prompts}) == len(prompts)
    runs = generate_all(run_vllm, smollm2_dir, prompts, max_tokens=SHORT_MAX_TOKENS)
    assert_backends_read_back(runs)
    assert_same_tokens(runs, SHORT_MAX_TOKENS)
    # The model works: every answer has words, and the code request gets code.
    texts = runs["stock"]["texts"]
    assert all(text.strip() for text in texts), texts
    assert "def " in texts[SHORT_QUESTIONS.index(CODE)], texts


@pytest.mark.slow
def test_long_batch_with_chunked_prefill_and_prefix_cache_matches_stock(smollm2_dir, chat_prompts, run_vllm):
    prompts = chat_prompts(LONG_CONVERSATIONS)
    lengths = [len(p["prompt_token_ids"]) for p in prompts]
    assert max(lengths) > 2 * LONG_ENGINE["max_num_batched_tokens"], lengths  # chunked for sure
    runs = generate_all(
        run_vllm, smollm2_dir, prompts, max_tokens=LONG_MAX_TOKENS, engine_kwargs=LONG_ENGINE,
        extra_args=["--prefix-prompts-json", json.dumps(chat_prompts(LONG_WARMUP)), "--metrics"],
    )
    assert_backends_read_back(runs)
    assert_same_tokens(runs, LONG_MAX_TOKENS)
    assert all(text.strip() for text in runs["stock"]["texts"]), runs["stock"]["texts"]
    for label, run in runs.items():
        # Three prompts share the warm-up's first two full blocks (64 tokens) at least.
        hits = run["metrics"].get("vllm:prefix_cache_hits", 0)
        assert hits >= 3 * 64, f"{label}: expected prefix-cache hits, got {run['metrics']}"
