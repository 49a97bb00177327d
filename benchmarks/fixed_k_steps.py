"""Benchmark: what a verifying step costs at one batch size, drafting a fixed k every step.

    .venv/bin/python -m benchmarks.fixed_k_steps                      # batch 8, k 1, 2, 3, the support set
    .venv/bin/python -m benchmarks.fixed_k_steps --batch 1 --ks 1,3,5 --set code
    .venv/bin/python -m benchmarks.fixed_k_steps --compile            # vLLM's default compiled engines

Where a batch size stops paying, shown without the controller: engines of the `accel
demo` harness (single-process vLLM CPU build, the family's target), plain decoding and
ours with the family's drafts.yaml at ``controller.adaptive: false`` and
``num_speculative_tokens: k`` (every request drafts k at every step), for each k of
``--ks``. One batch of ``--batch`` prompts of ``--set``, ``--rounds`` rounds, engines in
turn. Printed per engine: tok/s and the median paired ratio against plain, steps, the
tokens each step gave a request, ms per step and the proposer's whole ``propose()`` ms
per step (drafting: prompt lookup or the draft's forwards, catch-up included). A step of
plain decoding gives each request one token; ours pays when its tokens per step
outgrow its step time over plain's. Plain's steps are its longest answer (one token per
step per request once every prompt is in). Engines are eager (``enforce_eager``) unless
``--compile``: then every engine compiles as vLLM's CPU default does, and the mode each
one ran in is read back and printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from accel_plugin.cli.common import int_list_arg
from accel_plugin.demo.family import FamilyError, default_models_dir
from accel_plugin.demo.plan import open_prompt_set
from accel_plugin.demo.report import engine_lines, paired_ratio, summarise


#: An argparse type: comma-separated k values 1..16 (``1,2,3``).
k_list = int_list_arg("k values", 1, 16, "1,2,3")


def fixed_config(source: Path, k: int, out_dir: Path) -> Path:
    """``source`` (a draft YAML) with ``adaptive: false`` and ``num_speculative_tokens: k``, its
    draft paths made absolute, written to ``out_dir``."""
    data = yaml.safe_load(source.read_text())
    for entry in [*(data.get("domains") or {}).values(), data.get("default") or {}]:
        if isinstance(entry, dict) and entry.get("draft"):
            entry["draft"] = str((source.parent / entry["draft"]).resolve())
    data["num_speculative_tokens"] = k
    data["controller"] = {"adaptive": False}
    path = out_dir / f"fixed-k{k}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def row(name: str, result: dict, plain: dict | None, batch: int) -> dict:
    run = result["runs"][0]
    summary = summarise(result)[("fixed", batch)]
    rounds = len(run.get("seconds_all") or [run["seconds"]])  # the proposer's counters sum the rounds
    steps = run.get("propose_steps", 0) / rounds or max((len(ids) for ids in run["token_ids"]), default=0)
    return {"engine": name, "tokens_per_s": summary["tokens_per_s"],
            "ratio": paired_ratio(summarise(plain)[("fixed", batch)], summary) if plain else 1.0,
            "steps": round(steps), "tokens_per_step": run["generated"] / max(steps, 1) / batch,
            "step_ms": 1e3 * run["seconds"] / max(steps, 1),
            "propose_ms": 1e3 * run["propose_seconds"] / rounds / steps if run.get("propose_steps") else None}


def render(rows: list[dict]) -> str:
    head = f"{'engine':<8} {'tok/s':>7} {'ratio':>6} {'steps':>6} {'tok/step/req':>12} {'ms/step':>8} {'propose ms':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        propose = "-" if r["propose_ms"] is None else f"{r['propose_ms']:.2f}"
        lines.append(f"{r['engine']:<8} {r['tokens_per_s']:>7.1f} {r['ratio']:>5.2f}x {r['steps']:>6} "
                     f"{r['tokens_per_step']:>12.2f} {r['step_ms']:>8.1f} {propose:>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fixed_k_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="requests decoded together (default: %(default)s)")
    parser.add_argument("--ks", type=k_list, default=(1, 2, 3), help="fixed k values (default: 1,2,3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per prompt (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (default: %(default)s)")
    parser.add_argument("--set", default="support", help="prompt set of the family (default: %(default)s)")
    parser.add_argument("--models", type=Path, default=default_models_dir(), help="demo family folder")
    parser.add_argument("--compile", action="store_true",
                        help="every engine compiled as vLLM's CPU default does (its compilation mode, read back, "
                             "is printed) instead of eager; minutes more per engine at start")
    args = parser.parse_args(argv)
    if not 1 <= args.batch <= 256 or args.max_tokens < 1 or args.rounds < 1:
        parser.error("--batch must be 1..256, --max-tokens and --rounds >= 1")
    from accel_plugin.adapters.vllm.demo import run_side_by_side

    try:
        family, target, prompts = open_prompt_set(args.models, args.set)
    except FamilyError as exc:
        raise SystemExit(str(exc)) from None
    batch = [prompts[i % len(prompts)] for i in range(args.batch)]
    with tempfile.TemporaryDirectory(prefix="accel-fixed-k-") as tmp:
        configs = {"plain": None, **{f"k={k}": fixed_config(family.config_path("tuned"), k, Path(tmp))
                                     for k in args.ks}}
        results = run_side_by_side(target, configs, warmup=[batch], repeats=args.rounds,
                                   timed=[{"name": f"fixed|{args.batch}|0", "prompts": batch}],
                                   num_speculative_tokens=max(args.ks), max_tokens=args.max_tokens,
                                   ignore_eos=family.ignore_eos, max_model_len=family.max_model_len,
                                   max_num_seqs=max(16, args.batch), compile=args.compile,
                                   progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    rows = [row(name, results[name], None if name == "plain" else results["plain"], args.batch) for name in configs]
    print(f"{family.name}, set {args.set}, batch {args.batch}, up to {args.max_tokens} tokens per prompt, "
          f"{args.rounds} rounds, {'compiled' if args.compile else 'eager'} engines; ratio: median of paired rounds "
          "against plain; ms/step: the fastest round's time over the steps of a round")
    print("\n".join(engine_lines(results)))
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
