"""Start ``text-generation-server serve`` and drive it over gRPC like TGI's router.

Runs in the TGI environment, started by integration/test_tgi_attention.py. The
server is TGI's own CLI, unchanged; this script passes its environment through
(ACCEL_ATTENTION_BACKEND, ATTENTION, PREFIX_CACHING, TRITON_INTERPRET ...), so our
attention is activated by the ``.pth`` import hook, as for a user. Where the file is
not installed (editable install), ``--install-hook`` puts the hook on the server's
path instead: a ``sitecustomize`` in a temporary folder added to PYTHONPATH, which
runs exactly what the ``.pth`` line runs (``hook_route`` in the result says which).

Info -> Warmup -> ClearCache -> Prefill -> Decode ... over a unix socket, then the
server is stopped. Prints ``RESULT {json}`` (generated ids, the server's log file).

    python tgi_grpc.py MODEL_DIR --prompts-json '["a b"]' --max-new-tokens 8
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
p.add_argument("--prompts-json", required=True)
p.add_argument("--max-new-tokens", type=int, default=8)
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--log", default=None, help="server log file (default: a temporary file)")
p.add_argument("--install-hook", action="store_true")
p.add_argument("--timeout", type=float, default=240)
a = p.parse_args()

work = tempfile.mkdtemp(prefix="tgi-grpc-")
uds = os.path.join(work, "server")
log_path = a.log or os.path.join(work, "server.log")
env = dict(os.environ)
env.setdefault("OMP_NUM_THREADS", "1")
env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
env.setdefault("ATTENTION", "flashdecoding-ipex")
env.setdefault("PREFIX_CACHING", "1" if env["ATTENTION"].startswith("flashdecoding") else "0")
hook_route = "pth" if hook_file().exists() else None
if a.install_hook and hook_route is None:
    from accel_plugin.adapters.tgi._startup import PTH_LINE

    hook_route = "sitecustomize"
    with open(os.path.join(work, "sitecustomize.py"), "w") as f:
        f.write(PTH_LINE)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (work, env.get("PYTHONPATH")) if x)

cmd = [os.path.join(os.path.dirname(sys.executable), "text-generation-server"), "serve", a.model_dir,
       "--uds-path", uds, "--dtype", a.dtype, "--max-input-tokens", "256"]
sock = f"{uds}-0"
with open(log_path, "w") as log:
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
try:
    t0 = time.time()
    while not os.path.exists(sock):
        if server.poll() is not None or time.time() - t0 > a.timeout:
            raise SystemExit(f"server did not come up (rc={server.poll()}); log: {log_path}")
        time.sleep(0.5)
    startup_s = time.time() - t0
    stub = generate_pb2_grpc.TextGenerationServiceStub(grpc.insecure_channel(f"unix://{sock}"))
    info = stub.Info(generate_pb2.InfoRequest(), timeout=60)
    params = generate_pb2.NextTokenChooserParameters(temperature=1.0, repetition_penalty=1.0, top_k=0, top_p=1.0,
                                                     typical_p=1.0, do_sample=False)

    def request(i, text, n):
        return generate_pb2.Request(
            id=i, inputs=text, input_chunks=generate_pb2.Input(chunks=[generate_pb2.InputChunk(text=text)]),
            truncate=256, parameters=params,
            stopping_parameters=generate_pb2.StoppingCriteriaParameters(max_new_tokens=n, ignore_eos_token=True))

    stub.Warmup(generate_pb2.WarmupRequest(
        batch=generate_pb2.Batch(id=0, requests=[request(0, "the " * 60, 2)], size=1, max_tokens=256),
        max_input_tokens=256, max_prefill_tokens=512, max_total_tokens=512), timeout=a.timeout)
    stub.ClearCache(generate_pb2.ClearCacheRequest(), timeout=60)

    prompts = json.loads(a.prompts_json)
    batch = generate_pb2.Batch(id=1, requests=[request(i, t, a.max_new_tokens) for i, t in enumerate(prompts)],
                               size=len(prompts), max_tokens=2048)
    out = {i: [] for i in range(len(prompts))}
    response = stub.Prefill(generate_pb2.PrefillRequest(batch=batch), timeout=a.timeout)
    rpcs = 1
    while True:
        for g in response.generations:
            out[g.request_id].extend(g.tokens.ids)
        if not response.HasField("batch"):
            break
        response = stub.Decode(generate_pb2.DecodeRequest(batches=[response.batch]), timeout=a.timeout)
        rpcs += 1
    result = {"ids": [out[i][: a.max_new_tokens] for i in range(len(prompts))], "rpcs": rpcs,
              "startup_s": round(startup_s, 1), "model_dtype": info.dtype, "log": log_path,
              "hook_route": hook_route}
finally:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
print("RESULT " + json.dumps(result))
