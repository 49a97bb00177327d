"""Benchmark: TGI on SmolLM2-135M-Instruct without speculation, with its n-gram, and with our draft.

    .venv/bin/python benchmarks/tgi_speculative.py                  # batch 1 and 8
    .venv/bin/python benchmarks/tgi_speculative.py --batch-sizes 1 --prompts 4

Runs TGI v3.3.7 in its own environment (``$ACCEL_TGI_PYTHON``, default
``~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python``; docs/tgi.md) through
integration/scripts/tgi_spec_generate.py: ``FlashCausalLM`` loaded once per batch
size, driven as TGI's router drives it (prefill, decode steps, finished requests
filtered), greedy, stopping at EOS or ``--max-new-tokens``, on the held-out support
prompts of the demo (demo_models/smollm2/prompts/support-heldout.jsonl; another set
with ``--prompts-from``, e.g. ``general-heldout``, whose domain drafts.yaml serves with
the general draft) in the target's chat template: ``--prompts`` at batch 1, three batches at a larger batch size. Per batch size one process times, in turn, each round:

* ``plain``: no speculation (``--speculate 0``), TGI's own matrices: TGI's default;
* ``packed``: the same with the target's packed copies as ``accel`` has them
  (``adapters/tgi/packed_linears.py``: the native few-row product, or oneDNN's, above
  the rows where TGI's ``F.linear`` measured faster): what the copies alone are worth;
* ``ngram``: TGI's own n-gram speculation, ``--speculate N``;
* ``accel``: ``--speculate N`` with ``ACCEL_DRAFT_CONFIG=demo_models/smollm2/drafts.yaml``
  (the tuned ``support`` draft, with prompt lookup where the context has a match, or
  the draft of the prompt set's domain; default adaptive controller).

TGI's own attention throughout (``ATTENTION=flashdecoding-ipex``, TGI's CPU default;
the adapter's ``Seqlen.max_k`` workaround is in place for both speculative
configurations, without which IPEX crashes or miscomputes). Each configuration runs
once on one prompt first (untimed); then batch by batch, every configuration in
turn, so that all see the same moments of a shared machine. Printed: tokens/s, the
ratio to plain, tokens per request and decode step, acceptance, whether outputs
equal plain decoding, what each configuration ran (attention function and
proposer, read back from the process), and the controller's cost measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from accel_plugin.diagnostics.host import cpu_info, cpu_line

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "integration" / "scripts" / "tgi_spec_generate.py"
DEMO = ROOT / "demo_models" / "smollm2"
RUNS = {"plain": "plain", "packed": "plain+packed", "ngram": "ngram", "accel": "spec"}


def _tgi_python() -> Path:
    return Path(os.environ.get("ACCEL_TGI_PYTHON", "~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python")).expanduser()


#: --prompts-from: a prompt set of the demo -> the drafts.yaml domain its prompts are routed to
PROMPT_SETS = {"support-heldout": "support", "support-freestyle": "support", "code-heldout": "code",
               "general-heldout": "default"}


def _prompts(n: int, name: str = "support-heldout") -> list[str]:
    lines = (DEMO / "prompts" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines[:n]]


def _run(target: Path, batch_size: int, args) -> dict:
    prompts = _prompts(args.prompts if batch_size == 1 else min(24, 3 * batch_size), args.prompts_from)
    cmd = [str(_tgi_python()), str(SCRIPT), "--attention", "flashdecoding-ipex", "--speculate", str(args.speculate),
           "--model", f"smollm2={target}", "--config", f"smollm2={DEMO / 'drafts.yaml'}", "--chat", "smollm2",
           "--stop-at-eos", "smollm2", "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(batch_size),
           "--runs", ",".join(RUNS.values()), "--repeats", str(args.rounds), "--warmup", "--install-hook",
           "--prompts-json", json.dumps({"smollm2": prompts})]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("ACCEL_ATTENTION_BACKEND", None)
    env["ACCEL_DRAFT_CONFIG"] = str(DEMO / "drafts.yaml")
    proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=3600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"TGI run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def _rows(result: dict, batch_size: int, domain: str = "support") -> list[list[str]]:
    model = result["models"]["smollm2"]
    runs = model["runs"]
    plain = runs["plain"]
    base = plain["tokens"] / statistics.median(plain["seconds"])
    inner = result["paged_attention_inner"].removeprefix("text_generation_server.layers.attention.")
    fix = " + Seqlen.max_k fix" if result["max_k_patch"] else ""
    attention = f"{result['attention']} ({inner}{fix})"
    rows = []
    for name, run in RUNS.items():
        r = runs[run]
        tok_s = r["tokens"] / statistics.median(r["seconds"])
        requests = len(r["ids"])
        row_steps = sum(len(step) for step in r["per_step"])  # (request, decode step) pairs
        per_step = (r["tokens"] - requests) / row_steps if row_steps else 0.0
        if name == "accel":
            # the domain's draft, and its prompt lookup where drafts.yaml gives it one
            # (label, prefix of its acceptance, the proposer's entry)
            entries = [(label, prefix, r["stats"][key]) for label, prefix, key in
                       ((f"{domain} draft", "", domain), ("lookup", "lookup ", f"{domain}/lookup"))
                       if key in r["stats"]]
            speculation = f"{model['proposer']} (" + "; ".join(
                f"{label}, k {st['k']}/{st['k_max']}, {st['state']}" for label, _, st in entries) + ")"
            acceptance = "; ".join(
                f"{prefix}{st['accepted']}/{st['drafted']}"
                + (f" (alpha {st['alpha']:.2f})" if st.get("alpha") is not None else "") for _, prefix, st in entries)
        elif name == "packed":
            speculation = "none; accel's packed copies of the target matrices (what they alone are worth)"
            acceptance = "-"
        elif name == "ngram":
            speculation, acceptance = f"TGI n-gram, --speculate {result['speculate']}", "-"
        else:
            speculation, acceptance = "none", "-"
        same = sum(a == b for a, b in zip(r["ids"], plain["ids"]))
        rows.append([str(batch_size), name, speculation, attention, f"{tok_s:.1f}", f"{tok_s / base:.2f}x",
                     f"{per_step:.2f}", acceptance, f"{same}/{requests}"])
    return rows


def _step_ms(run: dict) -> float | None:
    """Median wall time of the configuration over its decode steps (prefills included: they are few)."""
    return 1e3 * statistics.median(run["seconds"]) / run["steps"] if run.get("steps") else None


def _notes(result: dict, batch_size: int, domain: str = "support") -> str:
    """What the controller measured for the domain's draft at this batch size (its view of the costs), and
    the share of the step spent in propose() (the core's call: draft forwards plus its host work)."""
    runs = result["models"]["smollm2"]["runs"]
    s = runs["spec"]["stats"].get(domain)
    if s is None:
        return f"batch {batch_size}: the proposer has no entry for the {domain} domain"
    bucket = min(s["costs_by_bucket"], key=lambda b: abs(int(b) - batch_size), default=None)
    costs = s["costs_by_bucket"].get(bucket, {})
    fmt = lambda v, f: "n/a" if v is None else format(v, f)
    plain_ms, spec_ms, propose_ms = _step_ms(runs["plain"]), _step_ms(runs["spec"]), s["propose_ms_per_step"]
    share = propose_ms / spec_ms if propose_ms is not None and spec_ms else None
    line = (f"batch {batch_size}, {domain} draft (controller, batch bucket {bucket}): alpha {fmt(s['alpha'], '.2f')}, "
            f"k {costs.get('k')}, c {fmt(costs.get('c'), '.3f')} (weight-size ratio {fmt(s['cost_ratio_size'], '.3f')}), "
            f"v {fmt(costs.get('v'), '.3f')}, predicted S {fmt(costs.get('expected_speedup'), '.2f')}; "
            f"one draft forward {fmt(s['draft_forward_ms'], '.1f')} ms, propose() {fmt(propose_ms, '.1f')} "
            f"ms per step, {fmt(share, '.0%')} of the {fmt(spec_ms, '.1f')} ms step (plain step {fmt(plain_ms, '.1f')} ms)")
    step_stats = runs["spec"].get("step_stats")  # the proposer's step gate, where the script reports it
    if step_stats:
        line += "; step gate: " + json.dumps(step_stats)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompts", type=int, default=8,
                        help="prompts (of 24) at batch 1; at batch b > 1: 3 batches (at most 24)")
    parser.add_argument("--prompts-from", default="support-heldout", choices=sorted(PROMPT_SETS),
                        help="the demo's prompt set (demo_models/smollm2/prompts/NAME.jsonl); its domain's "
                             "draft is the one reported")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--speculate", type=int, default=5, help="TGI's --speculate N (the YAML's k_max is 5)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds per configuration (median)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the TGI process")
    parser.add_argument("--json-out", default=None,
                        help='write the raw results here ({"cpu": the machine, "runs": per batch size})')
    args = parser.parse_args()
    if not _tgi_python().exists():
        sys.exit(f"needs a TGI environment: {_tgi_python()} not found (set ACCEL_TGI_PYTHON; see docs/tgi.md)")
    from accel_plugin.models import store as model_store

    target = model_store.cached_path("smollm2")
    if target is None:
        sys.exit("SmolLM2-135M-Instruct is not cached: run `accel models get smollm2`")
    header = ["batch", "config", "speculation", "attention", "tok/s", "vs plain", "tokens/step", "accepted",
              "= plain"]
    rows, notes, raw = [], [], {}
    for size in (int(b) for b in args.batch_sizes.split(",")):
        print(f"batch {size}: up to {args.max_new_tokens} tokens per prompt ...", file=sys.stderr)
        raw[size] = result = _run(target, size, args)
        rows += _rows(result, size, PROMPT_SETS[args.prompts_from])
        notes.append(_notes(result, size, PROMPT_SETS[args.prompts_from]))
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"machine: {cpu_line()}")
    for note in notes:
        print(note)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"cpu": cpu_info(), "runs": raw}))


if __name__ == "__main__":
    main()
