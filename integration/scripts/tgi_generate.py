"""Greedy generation through TGI's FlashCausalLM on CPU, with TGI's attention and with ours.

Runs in the TGI environment (torch + IPEX + text_generation_server), started by
integration/test_tgi_attention.py. One process serves one ATTENTION mode (TGI reads
it at import) and runs several configurations on the same loaded models, switching
in between with the adapter's own API:

* ``env``: whatever ACCEL_ATTENTION_BACKEND activated when TGI was imported (through
  the ``.pth`` import hook; ``--install-hook`` installs the hook first where the file
  is missing, as after an editable install);
* ``own``: ``uninstall()``, i.e. TGI's attention with every original restored;
* ``flash`` / ``paged`` / ``auto``: ``activate(setting)``;
* suffixes: ``+specN`` runs with n-gram speculation of depth N (decode rows k+1 per
  sequence); ``+join`` lets the second half of the prompts join the running batch
  after two steps, as TGI's router adds requests (with ``--chunk-len``, under
  ``flashdecoding-ipex``, prompts are prefilled in chunks, and the joining prompts
  share a forward pass with the first half's decode rows);
* ``@name1/name2`` limits a run to those models.

    python tgi_generate.py --attention paged --model tiny=tiny:gqa-d64@float32 \\
        --runs env,own,paged,flash+join --prompts-json '["a b", "c d e"]'

Prints ``RESULT {json}``: per run and model the generated ids, how often our two
functions were called, and which modules hold our functions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--attention", required=True, choices=["paged", "flashdecoding-ipex", "flashdecoding", "flashinfer"])
p.add_argument("--model", action="append", required=True,
               help="NAME=PATH[@DTYPE], or NAME=tiny:SHAPE[@DTYPE] to build a tiny model "
                    "(accel_plugin.testing.tiny_models); DTYPE float32 (default), float16 or bfloat16")
p.add_argument("--models-dir", default=os.path.expanduser("~/.cache/accel-plugin/tgi-tiny-models"))
p.add_argument("--runs", default="env,own",
               help="comma-separated: env, own, flash, paged, auto, each optionally +specN and/or +join")
p.add_argument("--prompts-json", required=True)
p.add_argument("--max-new-tokens", type=int, default=8)
p.add_argument("--num-blocks", type=int, default=32)
p.add_argument("--chunk-len", type=int, default=0,
               help="in +join runs, prefill prompts in chunks of this many tokens (flashdecoding-ipex)")
p.add_argument("--install-hook", action="store_true",
               help="install the import hook before importing TGI when the .pth file did not")
args = p.parse_args()

os.environ["ATTENTION"] = args.attention
os.environ["PREFIX_CACHING"] = "1" if args.attention.startswith("flashdecoding") else "0"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

from accel_plugin.adapters import tgi as adapter
from accel_plugin.adapters.tgi import _patches
from accel_plugin.adapters.tgi import attention as accel_attention

hook_from_pth = _patches.IMPORT_HOOK.present
if args.install_hook and not hook_from_pth:
    adapter.install_import_hook()

import torch

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def model_path(spec: str) -> str:
    if spec.startswith("tiny:"):
        from accel_plugin.testing.tiny_models import build_tiny_model

        return str(build_tiny_model(spec[len("tiny:"):], args.models_dir))
    return spec


models_spec = {}
for item in args.model:
    name, _, spec = item.partition("=")
    spec, _, dtype = spec.partition("@")
    models_spec[name] = (model_path(spec), dtype or "float32")

t0 = time.time()
from text_generation_server.models import globals as tgi_globals
from text_generation_server.models.custom_modeling.flash_llama_modeling import (
    FlashLlamaForCausalLM,
)
from text_generation_server.models.flash_causal_lm import FlashCausalLM
from text_generation_server.pb import generate_pb2
from text_generation_server.utils.prefill_chunking import set_max_prefill_tokens
from text_generation_server.utils.speculate import set_speculate

import_s = time.time() - t0
BLOCK_SIZE = tgi_globals.BLOCK_SIZE
active_at_import = adapter.is_active()
backend_at_import = accel_attention.current().backend if accel_attention.current() else None

set_speculate(0)
loaded = {}
for name, (path, dtype) in models_spec.items():
    model = FlashCausalLM(model_id=path, model_class=FlashLlamaForCausalLM, dtype=getattr(torch, dtype),
                          lora_adapter_ids=[])
    model.init_kv_cache(args.num_blocks, model.num_layers, model.num_kv_heads, model.head_size,
                        model.kv_cache_dtype, model.device)
    loaded[name] = model

prompts = json.loads(args.prompts_json)
PARAMS = generate_pb2.NextTokenChooserParameters(temperature=1.0, repetition_penalty=1.0, top_k=0, top_p=1.0,
                                                 typical_p=1.0, do_sample=False)


def pb_batch(model, indices, chunk_len: int, speculate: int, first_block: int):
    """Requests ``indices`` with explicit blocks and slots from ``first_block`` on, as TGI's
    router assigns them (so that separately built batches can be concatenated)."""
    stop = generate_pb2.StoppingCriteriaParameters(max_new_tokens=args.max_new_tokens, ignore_eos_token=True)
    reqs = [generate_pb2.Request(id=i, inputs=prompts[i], truncate=1024, parameters=PARAMS, stopping_parameters=stop,
                                 input_chunks=generate_pb2.Input(chunks=[generate_pb2.InputChunk(text=prompts[i])]))
            for i in indices]
    probe = model.batch_type.from_pb(generate_pb2.Batch(id=0, requests=reqs, size=len(reqs), max_tokens=8192),
                                     model.tokenizer, model.dtype, model.device)
    block = first_block
    for req, length in zip(reqs, probe.prompt_lengths):
        if chunk_len:
            req.chunk_len = min(chunk_len, length)
        needed = -(-(length + args.max_new_tokens + speculate) // BLOCK_SIZE)
        req.blocks.extend(range(block, block + needed))
        req.slots.extend(range(block * BLOCK_SIZE, (block + needed) * BLOCK_SIZE))
        block += needed
    if block > args.num_blocks:
        raise SystemExit(f"--num-blocks {args.num_blocks} is too small: these prompts need {block}")
    batch = generate_pb2.Batch(id=first_block, requests=reqs, size=len(reqs), max_tokens=8192)
    return model.batch_type.from_pb(batch, model.tokenizer, model.dtype, model.device), block


def generate(model, speculate: int, join: bool):
    """Greedy ids per prompt. With ``join`` the second half of the prompts arrives after two
    steps of the first half, as TGI's router adds requests: with chunked prefill its
    prompts share a forward pass with the first half's decode rows (``Batch.concatenate``
    before the step); without, they are prefilled alone and then decoded together."""
    set_speculate(speculate)
    chunk_len = 0 if speculate or not join or not model.support_chunking else args.chunk_len
    set_max_prefill_tokens(chunk_len + len(prompts) if chunk_len else 8192)
    order = list(range(len(prompts)))
    half = len(order) // 2 if join else len(order)
    batch, next_block = pb_batch(model, order[:half], chunk_len, speculate, 0)
    out = {i: [] for i in order}
    steps = 0

    def step(b):
        nonlocal steps
        generations, b, _ = model.generate_token(b)
        steps += 1
        for g in generations:
            out[g.request_id].extend(g.tokens.token_ids)
        return b

    pending = order[half:]
    while batch is not None or pending:
        if pending and (steps >= 2 or batch is None):
            late, next_block = pb_batch(model, pending, chunk_len, speculate, next_block)
            pending = []
            if model.support_chunking:
                batch = late if batch is None else model.batch_type.concatenate([batch, late])
            else:
                late = step(late)
                batch = [b for b in (batch, late) if b is not None]
                batch = model.batch_type.concatenate(batch) if len(batch) > 1 else (batch[0] if batch else None)
            continue
        batch = step(batch)
    set_speculate(0)
    return [out[i][: args.max_new_tokens] for i in order], steps


results = {}
errors = {}
for run in args.runs.split(","):
    spec_, _, only = run.partition("@")
    base, *options = spec_.split("+")
    join = "join" in options
    speculate = next((int(o[len("spec"):]) for o in options if o.startswith("spec")), 0)
    if base == "own":
        adapter.uninstall()
    elif base != "env":
        adapter.activate(base)
    settings = accel_attention.current()
    llama = sys.modules["text_generation_server.models.custom_modeling.flash_llama_modeling"]
    ours = (llama.attention is accel_attention.attention, llama.paged_attention is accel_attention.paged_attention)
    entry = {"backend": settings.backend if settings else None, "llama_module_bound_to_ours": list(ours),
             "rebound_modules": len(_patches.ATTENTION_FUNCTIONS.rebound_modules()), "models": {}}
    for name, model in loaded.items():
        if only and name not in only.split("/"):
            continue
        accel_attention.reset()
        t1 = time.time()
        try:
            ids, steps = generate(model, speculate, join)
        except Exception as exc:  # noqa: BLE001  (reported; the test decides)
            errors[f"{run}/{name}"] = f"{type(exc).__name__}: {exc}"
            continue
        entry["models"][name] = {"ids": ids, "steps": steps, "seconds": round(time.time() - t1, 2),
                                 "calls": accel_attention.call_counts()}
    results[run] = entry

kv = next(iter(loaded.values())).kv_cache[0]
print("RESULT " + json.dumps({
    "attention": tgi_globals.ATTENTION, "block_size": tgi_globals.BLOCK_SIZE, "kv_key_shape": list(kv.key.shape),
    "hook_from_pth": hook_from_pth, "active_at_import": active_at_import, "backend_at_import": backend_at_import,
    "import_s": round(import_s, 1), "runs": results, "errors": errors,
    "model_paths": {name: path for name, (path, _) in models_spec.items()},
}))
sys.stdout.flush()
