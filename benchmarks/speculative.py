"""Benchmark: real vLLM (CPU build) with and without the domain proposer, side by side.

    .venv/bin/python benchmarks/speculative.py            # defaults below
    .venv/bin/python benchmarks/speculative.py --max-tokens 128 --k 4 --rounds 2

Models (built locally, seeded, synthetic; see integration/scripts/vllm_spec_models.py):
a 25.6M-parameter Llama target whose layers after the first are damped, and a
one-layer 3.5M draft cut from it (greedy agreement about 0.8): the "good,
domain-tuned" draft of domains ``support`` and ``default``. Domain ``code`` gets a
random draft (agreement about 0): the controller should switch it off.

Each configuration runs in its own vLLM engine (a subprocess, one process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless --multiprocess), after a warm-up
generate; per round, the prompts of the well-drafted domains are one batch and the
code prompts another (a batch runs as long as its slowest request, so mixing them
would time the poor domain only). Printed: generated tokens/s per batch kind and
configuration and the ratio to plain decoding, vLLM's acceptance counters, and
per domain the proposer's acceptance, k, state and drafting cost per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "integration" / "scripts"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"

PROMPTS = {
    "support": ["Customer: my refund ticket #123 is late", "Where is my delivery? order 55",
                "Customer: my order ticket #9 was not fast", "refund the delivery please"],
    "code": ["def foo(a, b):", "import os\nclass Model:"],
    "default": ["The model is", "A small prompt answer", "Data is not fast", "Question: what is the cache"],
}


def _models(cache: Path):
    spec = importlib.util.spec_from_file_location("vllm_spec_models", SCRIPTS / "vllm_spec_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from accel_plugin.testing.tiny_models import build_tiny_model

    target, good = module.layered_pair(cache, damping=0.05)
    poor = build_tiny_model("draft-d32", cache, seed=7)
    return target, good, poor


def _run(target: Path, batches: list[list[str]], args, spec=None, config: Path | None = None) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if args.multiprocess else "0"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("ACCEL_DRAFT_CONFIG", None)
    if config is not None:
        env["ACCEL_DRAFT_CONFIG"] = str(config)
    cmd = [sys.executable, str(SCRIPTS / "vllm_spec_generate.py"), str(target), "--warmup",
           "--batches-json", json.dumps(batches), "--max-tokens", str(args.max_tokens),
           "--dtype", args.dtype, "--spec-json", json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"vLLM run failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (k_max)")
    parser.add_argument("--rounds", type=int, default=2, help="generate calls per configuration (timed)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--multiprocess", action="store_true")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "accel-bench-models"))
    args = parser.parse_args()

    target, good, poor = _models(Path(args.cache))
    # one batch of the well-drafted domains, one of the poorly drafted one, per round
    good_batch = PROMPTS["support"] + PROMPTS["default"]
    batches = [good_batch, PROMPTS["code"]] * args.rounds
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": args.k}
    configs: dict[str, tuple[dict | None, Path | None]] = {"plain": (None, None)}
    for name, adaptive in (("accel adaptive", True), ("accel fixed k", False)):
        path = Path(args.cache) / f"bench-{'adaptive' if adaptive else 'fixed'}.yaml"
        # the controller's tuning keys only where they act (the YAML refuses them with adaptive: false)
        controller = "{adaptive: true, min_samples: 8, probe_interval: 16}" if adaptive else "{adaptive: false}"
        path.write_text(textwrap.dedent(f"""\
            num_speculative_tokens: {args.k}
            domains:
              support:
                draft: {good}
                match: {{keywords: [refund, delivery, order, ticket]}}
              code:
                draft: {poor}
                match: {{regex: ['(?m)^\\s*(def|class|import)\\b']}}
            default:
              draft: {good}
            controller: {controller}
        """))
        configs[name] = (spec, path)
    configs["vllm draft_model"] = ({"method": "draft_model", "model": str(good), "num_speculative_tokens": args.k}, None)

    results = {name: _run(target, batches, args, spec=s, config=c) for name, (s, c) in configs.items()}

    def tokens_per_s(r: dict, which: int) -> float:  # which: 0 = good batch, 1 = code batch
        return sum(r["generated"][which::2]) / sum(r["seconds"][which::2])

    plain = [tokens_per_s(results["plain"], i) for i in (0, 1)]
    print(f"\ntarget {target.name}; per round one batch of {len(good_batch)} prompts of domains support/default "
          f"(good draft) and one of {len(PROMPTS['code'])} code prompts (random draft); {args.max_tokens} tokens each, "
          f"{args.rounds} round(s), k_max {args.k}, {args.dtype}\n")
    print(f"{'configuration':<18} {'good: tok/s':>11} {'vs plain':>9} {'code: tok/s':>11} {'vs plain':>9} "
          f"{'accepted/drafted':>17} {'mean acc. len':>14}  same output")
    for name, r in results.items():
        good_tps, code_tps = tokens_per_s(r, 0), tokens_per_s(r, 1)
        counters = r["spec"] or {}
        drafted, accepted, drafts = (counters.get(k, 0) for k in ("num_draft_tokens", "num_accepted_tokens", "num_drafts"))
        rate = f"{accepted}/{drafted}" if drafted else "-"
        mal = f"{1 + accepted / drafts:.2f}" if drafts else "-"
        same = r["token_ids"] == results["plain"]["token_ids"]
        print(f"{name:<18} {good_tps:>11.1f} {good_tps / plain[0]:>8.2f}x {code_tps:>11.1f} {code_tps / plain[1]:>8.2f}x "
              f"{rate:>17} {mal:>14}  {same}")
    for name in ("accel adaptive", "accel fixed k"):
        any_stats = next(iter(results[name]["accel"].values()))
        print(f"\n{name}: per domain (drafting overhead, whole propose() call: "
              f"{any_stats['propose_ms_per_step']:.2f} ms per step)")
        print(f"  {'domain':<8} {'state':<8} {'k':>3} {'steps':>6} {'drafted':>8} {'accepted':>9} {'alpha':>6} "
              f"{'draft fwd ms':>13} {'target step ms':>15} {'c':>6} {'draft ms/step':>14}")
        for domain, s in results[name]["accel"].items():
            alpha = "-" if s["alpha"] is None else f"{s['alpha']:.2f}"
            fwd, tgt = s["draft_forward_ms"], s["target_step_ms"]
            per_step = "-" if fwd is None or not s["steps"] else f"{fwd * s['drafted'] / s['steps']:.2f}"
            c = "-" if s["cost_ratio"] is None else f"{s['cost_ratio']:.3f}"
            print(f"  {domain:<8} {s['state']:<8} {s['k']:>3} {s['steps']:>6} {s['drafted']:>8} {s['accepted']:>9} "
                  f"{alpha:>6} {'-' if fwd is None else f'{fwd:.2f}':>13} "
                  f"{'-' if tgt is None else f'{tgt:.2f}':>15} {c:>6} {per_step:>14}")


if __name__ == "__main__":
    main()
