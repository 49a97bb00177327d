"""``text-generation-server serve`` with and without ``--speculate``, driven like TGI's router.

Runs in the TGI environment, started by integration/test_tgi_speculative.py. Two
servers, one after the other, on the same model: ``plain`` (no speculation) and
``spec`` (``--speculate N`` with ``ACCEL_DRAFT_CONFIG``, so that the import hook
wraps ``FlashCausalLM`` and the server drafts with the domain proposer). Each is
driven as the router drives it (backends/v3/src/backend.rs): Info, Warmup,
ClearCache, Prefill of the first half of the prompts, Decode steps, FilterBatch
after every step that finished requests, and after two steps a Prefill of the
second half, decoded together with the running batch (``Decode`` with both
batches: the server concatenates them). Blocks are assigned as the router does,
disjoint per request.

    python tgi_spec_grpc.py MODEL_DIR --draft-config drafts.yaml --speculate 3 \\
        --prompts-json '["a b", "c d"]' --max-new-tokens-json '[12, 9]'

Prints ``RESULT {json}``: per server the ids, the Decode RPCs and the log file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import grpc
from accel_plugin.adapters.tgi import hook_file
from text_generation_server.pb import generate_pb2, generate_pb2_grpc

p = argparse.ArgumentParser()
p.add_argument("model_dir")
p.add_argument("--draft-config", required=True)
p.add_argument("--speculate", type=int, default=3)
p.add_argument("--prompts-json", required=True)
p.add_argument("--max-new-tokens-json", required=True)
p.add_argument("--dtype", default="float16")
p.add_argument("--log-dir", default=None)
p.add_argument("--install-hook", action="store_true")
p.add_argument("--timeout", type=float, default=240)
a = p.parse_args()

BLOCK_SIZE = {"paged": 16, "flashdecoding-ipex": 64}
work = tempfile.mkdtemp(prefix="tgi-spec-grpc-")
log_dir = a.log_dir or work
prompts, news = json.loads(a.prompts_json), json.loads(a.max_new_tokens_json)
PARAMS = generate_pb2.NextTokenChooserParameters(temperature=1.0, repetition_penalty=1.0, top_k=0, top_p=1.0,
                                                 typical_p=1.0, do_sample=False)


def server_env(speculating: bool) -> tuple[dict, str | None]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env.setdefault("ATTENTION", "flashdecoding-ipex")
    env.setdefault("PREFIX_CACHING", "1" if env["ATTENTION"].startswith("flashdecoding") else "0")
    env.pop("ACCEL_DRAFT_CONFIG", None)
    if not speculating:
        return env, None
    env["ACCEL_DRAFT_CONFIG"] = a.draft_config
    route = "pth" if hook_file().exists() else None
    if a.install_hook and route is None:  # an editable install: the .pth line, as a sitecustomize
        from accel_plugin.adapters.tgi._startup import PTH_LINE

        route = "sitecustomize"
        with open(os.path.join(work, "sitecustomize.py"), "w") as f:
            f.write(PTH_LINE)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (work, env.get("PYTHONPATH")) if x)
    return env, route


def request(i: int, first_block: int, speculate: int, block_size: int):
    text = prompts[i]
    req = generate_pb2.Request(
        id=i, inputs=text, input_chunks=generate_pb2.Input(chunks=[generate_pb2.InputChunk(text=text)]),
        truncate=256, parameters=PARAMS,
        stopping_parameters=generate_pb2.StoppingCriteriaParameters(max_new_tokens=news[i], ignore_eos_token=True))
    # byte-level BPE: at most one token per byte, plus special tokens
    needed = -(-(len(text.encode()) + 8 + news[i] + speculate) // block_size)
    req.blocks.extend(range(first_block, first_block + needed))
    req.slots.extend(range(first_block * block_size, (first_block + needed) * block_size))
    return req, first_block + needed


def drive(stub, speculate: int, block_size: int) -> dict:
    out = {i: [] for i in range(len(prompts))}
    live: set[int] = set()
    next_block, batch_id = 1, 1  # block 0: the router's health check

    def batch(indices):
        nonlocal next_block, batch_id
        reqs = []
        for i in indices:
            req, next_block = request(i, next_block, speculate, block_size)
            reqs.append(req)
        batch_id += 1
        return generate_pb2.Batch(id=batch_id, requests=reqs, size=len(reqs), max_tokens=4096)

    def collect(response):
        for g in response.generations:
            out[g.request_id].extend(g.tokens.ids)
            if g.HasField("generated_text"):
                live.discard(g.request_id)
        cached = response.batch if response.HasField("batch") else None
        if cached is None or cached.size == len([r for r in cached.request_ids if r in live]):
            return cached
        keep = [r for r in cached.request_ids if r in live]
        if not keep:
            stub.ClearCache(generate_pb2.ClearCacheRequest(id=cached.id), timeout=a.timeout)
            return None
        return stub.FilterBatch(generate_pb2.FilterBatchRequest(batch_id=cached.id, request_ids=keep),
                                timeout=a.timeout).batch

    half = len(prompts) // 2
    live.update(range(half))
    cached = collect(stub.Prefill(generate_pb2.PrefillRequest(batch=batch(range(half))), timeout=a.timeout))
    pending, decodes = list(range(half, len(prompts))), 0
    while cached is not None or pending:
        batches = [cached] if cached is not None else []
        if pending and (decodes >= 2 or cached is None):
            live.update(pending)
            new = collect(stub.Prefill(generate_pb2.PrefillRequest(batch=batch(pending)), timeout=a.timeout))
            pending = []
            batches += [new] if new is not None else []
        if not batches:
            continue
        cached = collect(stub.Decode(generate_pb2.DecodeRequest(batches=batches), timeout=a.timeout))
        decodes += 1
    return {"ids": [out[i] for i in range(len(prompts))], "decodes": decodes}


def run_server(name: str, speculating: bool) -> dict:
    env, route = server_env(speculating)
    uds = os.path.join(work, name)
    log_path = os.path.join(log_dir, f"grpc-{name}.log")
    cmd = [os.path.join(os.path.dirname(sys.executable), "text-generation-server"), "serve", a.model_dir,
           "--uds-path", uds, "--dtype", a.dtype, "--max-input-tokens", "256"]
    if speculating:
        cmd += ["--speculate", str(a.speculate)]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0, sock = time.time(), f"{uds}-0"
        while not os.path.exists(sock):
            if server.poll() is not None or time.time() - t0 > a.timeout:
                raise SystemExit(f"{name} server did not come up (rc={server.poll()}); log: {log_path}")
            time.sleep(0.5)
        channel = grpc.insecure_channel(f"unix://{sock}")
        stub = generate_pb2_grpc.TextGenerationServiceStub(channel)
        stub.Info(generate_pb2.InfoRequest(), timeout=60)
        warm = generate_pb2.Request(id=0, inputs="the " * 30, truncate=256, parameters=PARAMS,
                                    input_chunks=generate_pb2.Input(chunks=[generate_pb2.InputChunk(text="the " * 30)]),
                                    stopping_parameters=generate_pb2.StoppingCriteriaParameters(max_new_tokens=2))
        stub.Warmup(generate_pb2.WarmupRequest(batch=generate_pb2.Batch(id=0, requests=[warm], size=1, max_tokens=256),
                                               max_input_tokens=256, max_prefill_tokens=512, max_total_tokens=512),
                    timeout=a.timeout)
        stub.ClearCache(generate_pb2.ClearCacheRequest(), timeout=60)
        startup_s = time.time() - t0
        result = drive(stub, a.speculate if speculating else 0, BLOCK_SIZE[env["ATTENTION"]])
        channel.close()
        return {**result, "startup_s": round(startup_s, 1), "log": log_path, "hook_route": route}
    finally:
        t1 = time.time()
        server.terminate()
        try:
            server.wait(timeout=30)
            print(f"{name} server stopped in {time.time() - t1:.1f}s", file=sys.stderr)
        except subprocess.TimeoutExpired:
            server.kill()


results = {"plain": run_server("plain", False), "spec": run_server("spec", True)}
print("RESULT " + json.dumps(results))
