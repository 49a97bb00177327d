"""Greedy generation through TGI's FlashCausalLM with accel's draft-model speculation.

Runs in the TGI environment, started by integration/test_tgi_speculative.py and
benchmarks/tgi_speculative.py. One process serves one ATTENTION mode and loads
every model once; each model is built with ``ACCEL_DRAFT_CONFIG`` pointing at its
own YAML (``--config NAME=YAML``), so the import hook wraps ``FlashCausalLM`` and
the model attaches its domain proposer when it is built, as in a server. Runs:

* ``plain``: ``set_speculate(0)``: TGI without speculation (the reference);
* ``spec``: ``set_speculate(N)`` with the domain proposer;
* ``ngram``: ``set_speculate(N)`` with the proposer disabled: TGI's own n-gram;
* ``plain`` and ``ngram`` run TGI's own matrices only: the model's prepacked copies
  (:mod:`accel_plugin.adapters.tgi.packed_linears`, ours while it speculates: multi-row
  products) are dropped for them and made again for ``spec``; ``+packed`` keeps them
  (``plain+packed``: what the copies alone are worth);
* ``+join``: the second half of the prompts arrives after two steps, as TGI's
  router adds requests: prefilled alone, then ``concatenate``d with the running batch;
* ``@name1/name2`` limits a run to those models.

The loop does what TGI's router does between steps: requests whose ``Generation``
carries ``generated_text`` are filtered out of the batch (``FlashCausalLMBatch.filter``).
``--fault SUBSTR:N`` makes the draft model whose path contains SUBSTR raise on its
Nth drafting call (a draft forward that fails mid-run). ``--probe NAME=YAML@N``
builds model NAME once more with that YAML under ``--speculate N`` and reports the
start-up error; ``--revert-max-k`` takes the Seqlen.max_k workaround out again
(to show why it exists: TGI's flashdecoding-ipex attention then crashes).

    python tgi_spec_generate.py --attention flashdecoding-ipex --speculate 3 \\
        --model tiny=tiny:gqa-d64 --config tiny=drafts.yaml --runs plain,spec \\
        --prompts-json '{"tiny": ["a b", "c d e"]}'

Prints ``RESULT {json}``: per model and run the ids, the decode steps, the tokens
each request got per step, TGI-side step counters and the proposer's per-domain stats.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

p = argparse.ArgumentParser()
p.add_argument("--attention", default="flashdecoding-ipex", choices=["paged", "flashdecoding-ipex"])
p.add_argument("--model", action="append", required=True,
               help="NAME=PATH[@DTYPE], or NAME=tiny:SHAPE[@DTYPE] (accel_plugin.testing.tiny_models)")
p.add_argument("--config", action="append", default=[], help="NAME=YAML: the draft config of model NAME")
p.add_argument("--models-dir", default=os.path.expanduser("~/.cache/accel-plugin/tgi-tiny-models"))
p.add_argument("--speculate", type=int, default=3, help="TGI's --speculate N")
p.add_argument("--runs", default="plain,spec", help="comma-separated: plain, spec, ngram, each optionally +join")
p.add_argument("--prompts-json", required=True, help='{"NAME": [prompt, ...]} or [prompt, ...] for every model')
p.add_argument("--chat", action="append", default=[], help="NAME: wrap model NAME's prompts in its chat template")
p.add_argument("--max-new-tokens", type=int, default=16)
p.add_argument("--stop-at-eos", action="append", default=[], help="NAME: model NAME stops at EOS (default: ignored)")
p.add_argument("--batch-size", type=int, default=0, help="run the prompts in batches of this size (0: one batch)")
p.add_argument("--repeats", type=int, default=1, help="rounds of all runs (timings; ids from the last)")
p.add_argument("--warmup", action="store_true", help="run every configuration once on the first prompt, untimed")
p.add_argument("--fault", default=None, help="SUBSTR:N: the draft whose path contains SUBSTR fails on call N")
p.add_argument("--probe", action="append", default=[], help="NAME=YAML@N: the start-up error of this config")
p.add_argument("--revert-max-k", action="store_true")
p.add_argument("--install-hook", action="store_true")
args = p.parse_args()

os.environ["ATTENTION"] = args.attention
os.environ["PREFIX_CACHING"] = "1" if args.attention.startswith("flashdecoding") else "0"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
configs = dict(item.split("=", 1) for item in args.config)
if configs:  # the .pth line (and a hook installed here) look at the variable at start-up
    os.environ["ACCEL_DRAFT_CONFIG"] = next(iter(configs.values()))

from accel_plugin.adapters import tgi as adapter
from accel_plugin.adapters.tgi import _patches, packed_linears, speculative

hook_from_pth = _patches.IMPORT_HOOK.present
if args.install_hook and not hook_from_pth:
    adapter.install_import_hook()

import torch

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

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
tgi_globals.set_adapter_to_index({})  # what get_model does; FlashCausalLMBatch.filter reads it
set_max_prefill_tokens(8192)
BLOCK_SIZE = tgi_globals.BLOCK_SIZE
N = args.speculate


def model_path(spec: str) -> str:
    if spec.startswith("tiny:"):
        from accel_plugin.testing.tiny_models import build_tiny_model

        return str(build_tiny_model(spec[len("tiny:"):], args.models_dir))
    return spec


raw_prompts = json.loads(args.prompts_json)
models, prompts, errors, probes, paths = {}, {}, {}, {}, {}


def build(path, dtype, config, speculate):
    """FlashCausalLM as a server builds it, with ACCEL_DRAFT_CONFIG=config (None: unset)."""
    if config:
        os.environ["ACCEL_DRAFT_CONFIG"] = config
    else:
        os.environ.pop("ACCEL_DRAFT_CONFIG", None)
    set_speculate(speculate)  # as under `--speculate N` (TGI turns chunked prefill off)
    try:
        return FlashCausalLM(model_id=path, model_class=FlashLlamaForCausalLM, dtype=getattr(torch, dtype),
                             lora_adapter_ids=[])
    finally:
        os.environ.pop("ACCEL_DRAFT_CONFIG", None)


for item in args.model:
    name, _, spec = item.partition("=")
    spec, _, dtype = spec.partition("@")
    path = paths[name] = model_path(spec)
    t1 = time.time()
    model = build(path, dtype or "float32", configs.get(name), N)
    texts = raw_prompts[name] if isinstance(raw_prompts, dict) else raw_prompts
    if name in args.chat:
        texts = [model.tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                     add_generation_prompt=True) for t in texts]
    lengths = [len(model.tokenizer(t)["input_ids"]) for t in texts]
    blocks = sum(-(-(n + args.max_new_tokens + N) // BLOCK_SIZE) for n in lengths) + 1
    model.init_kv_cache(blocks, model.num_layers, model.num_kv_heads, model.head_size, model.kv_cache_dtype,
                        model.device)
    models[name], prompts[name] = model, texts
    print(f"loaded {name} in {time.time() - t1:.1f}s ({blocks} KV blocks)", file=sys.stderr)

for item in args.probe:
    name, _, rest = item.partition("=")
    config, _, speculate = rest.rpartition("@")
    try:
        speculative.detach(build(paths[name], "float32", config, int(speculate)))
        probes[item] = None
    except Exception as exc:  # noqa: BLE001  (the error is the result)
        probes[item] = f"{type(exc).__name__}: {exc}"
if args.revert_max_k:
    _patches.SEQLEN_MAX_K.revert()

if args.fault:
    substr, _, nth = args.fault.partition(":")
    for model in models.values():
        spec = speculative.of(model)
        if spec is None:
            continue
        real, calls = spec.core.engine.draft, {"n": 0}

        def draft(path, jobs, real=real, calls=calls):
            if substr in path:
                calls["n"] += 1
                if calls["n"] == int(nth):
                    raise RuntimeError("injected fault: draft forward failed")
            return real(path, jobs)

        spec.core.engine.draft = draft

PARAMS = generate_pb2.NextTokenChooserParameters(temperature=1.0, repetition_penalty=1.0, top_k=0, top_p=1.0,
                                                 typical_p=1.0, do_sample=False)


def pb_batch(model, texts, ids, speculate, first_block, stop_at_eos):
    """Requests with explicit blocks from ``first_block`` on, as TGI's router assigns them."""
    stop = generate_pb2.StoppingCriteriaParameters(max_new_tokens=args.max_new_tokens,
                                                   ignore_eos_token=not stop_at_eos)
    reqs = [generate_pb2.Request(id=i, inputs=t, truncate=4096, parameters=PARAMS, stopping_parameters=stop,
                                 input_chunks=generate_pb2.Input(chunks=[generate_pb2.InputChunk(text=t)]))
            for i, t in zip(ids, texts)]
    block = first_block
    for req, text in zip(reqs, texts):
        needed = -(-(len(model.tokenizer(text)["input_ids"]) + args.max_new_tokens + speculate) // BLOCK_SIZE)
        req.blocks.extend(range(block, block + needed))
        req.slots.extend(range(block * BLOCK_SIZE, (block + needed) * BLOCK_SIZE))
        block += needed
    batch = generate_pb2.Batch(id=first_block, requests=reqs, size=len(reqs), max_tokens=16384)
    return model.batch_type.from_pb(batch, model.tokenizer, model.dtype, model.device), block


def generate(model, texts, speculate, join, stop_at_eos):
    """Ids per prompt, decode steps, and per decode step the tokens each request got."""
    set_speculate(speculate)
    out = {i: [] for i in range(len(texts))}
    per_step = []
    half = len(texts) // 2 if join else len(texts)

    def run(batch, prefill):
        generations, batch, _ = model.generate_token(batch)
        stopped = set()
        for g in generations:
            out[g.request_id].extend(g.tokens.token_ids)
            if g.generated_text is not None:
                stopped.add(g.request_id)
        if not prefill:
            per_step.append({g.request_id: [len(g.tokens.token_ids), g.generated_text is not None]
                             for g in generations})
        if batch is not None and stopped:  # the router's FilterBatch
            keep = [r.id for r in batch.requests if r.id not in stopped]
            batch = batch.filter(keep) if keep else None
        return batch

    batch, next_block = pb_batch(model, texts[:half], range(half), speculate, 0, stop_at_eos)
    batch = run(batch, True)
    pending = list(range(half, len(texts)))
    while batch is not None or pending:
        if pending and (len(per_step) >= 2 or batch is None):
            late, next_block = pb_batch(model, [texts[i] for i in pending], pending, speculate, next_block,
                                        stop_at_eos)
            pending = []
            late = run(late, True)
            parts = [b for b in (batch, late) if b is not None]
            batch = model.batch_type.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else None)
            continue
        batch = run(batch, False)
    set_speculate(0)
    return [out[i] for i in range(len(texts))], per_step


def counters(model):
    spec = speculative.of(model)
    return asdict(spec.counters) if spec is not None else None


def set_packing(model, on: bool) -> None:
    """The model's target matrices with our prepacked copies (multi-row products) or TGI's own only."""
    spec = speculative.of(model)
    if spec is None:
        return
    packed = spec.packing is not None and bool(spec.packing.modules)
    if on and not packed:
        spec.packing = packed_linears.pack_target(model)
    elif not on and packed:
        spec.packing.undo()


def configure(run):
    """(base, options, model names) of a run; points the models' proposers at it."""
    what, _, only = run.partition("@")
    base, *options = what.split("+")
    names = [n for n in models if not only or n in only.split("/")]
    for name in names:
        spec = speculative.of(models[name])
        if spec is not None:
            spec.enabled = base != "ngram"  # ngram: TGI's own proposals
            set_packing(models[name], base == "spec" or "packed" in options)
    return base, options, names


results = {name: {"runs": {}} for name in models}
runs = args.runs.split(",")
if args.warmup:
    for run in runs:
        base, _, names = configure(run)
        for name in names:
            generate(models[name], prompts[name][:1], 0 if base == "plain" else N, False, name in args.stop_at_eos)
for round_ in range(args.repeats):
    for name, model in models.items():
        texts = prompts[name]
        size = args.batch_size or len(texts)
        done = {run: {"seconds": 0.0, "ids": [], "per_step": [], "counters": None, "stats": None} for run in runs}
        # batch by batch, every run in turn: the runs see the same moments of a shared machine
        for start in range(0, len(texts), size):
            for run in runs:
                base, options, names = configure(run)
                if name not in names or f"{run}/{name}" in errors or (base == "spec" and speculative.of(model) is None):
                    continue
                before, t1 = counters(model), time.perf_counter()
                try:
                    got, steps = generate(model, texts[start:start + size], 0 if base == "plain" else N,
                                          "join" in options, name in args.stop_at_eos)
                except Exception as exc:  # noqa: BLE001  (reported; the test decides)
                    errors[f"{run}/{name}"] = f"{type(exc).__name__}: {exc}"
                    continue
                d = done[run]
                d["seconds"] += time.perf_counter() - t1
                spec = speculative.of(model)
                d["packed"] = bool(spec is not None and spec.packing is not None and spec.packing.modules)
                d["ids"] += got
                d["per_step"] += steps
                if base == "spec":  # this run's share of the step counters; the proposer's stats after it
                    after = counters(model)
                    d["counters"] = {k: after[k] - before[k] + (d["counters"] or {}).get(k, 0) for k in after}
                    d["stats"] = speculative.collect_stats(model)
                    d["step_stats"] = spec.core.step_stats() if hasattr(spec.core, "step_stats") else None
        for run, d in done.items():
            if f"{run}/{name}" in errors or not d["ids"]:
                continue
            entry = results[name]["runs"].setdefault(run, {"seconds": []})
            entry["seconds"].append(round(d["seconds"], 3))
            entry.update(ids=d["ids"], steps=len(d["per_step"]), tokens=sum(map(len, d["ids"])), per_step=d["per_step"],
                         packed=d.get("packed", False))
            if d["counters"] is not None:
                entry.update(counters=d["counters"], stats=d["stats"], step_stats=d.get("step_stats"))

llama = sys.modules["text_generation_server.models.custom_modeling.flash_llama_modeling"]
inner = getattr(llama.paged_attention, "__wrapped__", llama.paged_attention)  # under the max_k workaround
for name, model in models.items():
    spec = speculative.of(model)
    results[name].update(
        attached=spec is not None, proposer=spec.proposer_name if spec else None,
        error=spec.error if spec else None, path=str(model.model_id),
    )
print("RESULT " + json.dumps({
    "attention": tgi_globals.ATTENTION, "speculate": N, "import_s": round(import_s, 1),
    "hook_from_pth": hook_from_pth, "speculation_patched": _patches.DRAFT_SPECULATION.applied,
    "max_k_patch": _patches.SEQLEN_MAX_K.applied, "attention_patch": _patches.ATTENTION_FUNCTIONS.applied,
    "paged_attention": f"{llama.paged_attention.__module__}.{llama.paged_attention.__qualname__}",
    "paged_attention_inner": f"{inner.__module__}.{inner.__qualname__}",
    "models": results, "errors": errors, "probes": probes,
}))
sys.stdout.flush()
