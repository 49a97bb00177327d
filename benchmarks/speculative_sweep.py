"""Benchmark: where drafting stops paying, batch size by batch size, on the real demo model.

    .venv/bin/python -m benchmarks.speculative_sweep                 # defaults below
    .venv/bin/python -m benchmarks.speculative_sweep --batches 1,8,32 --max-tokens 16 --set repeat
    .venv/bin/python -m benchmarks.speculative_sweep --batches 1,8,64 --compile   # vLLM's default compiled engines

Four engines of the `accel demo` harness (accel_plugin.adapters.vllm.demo.run_side_by_side,
single-process vLLM CPU build, SmolLM2-135M-Instruct of demo_models/smollm2), started in
this order: a control (plain decoding again: the first engine started read 3-10% slower
than later identical ones here, so the baseline is never the first), plain decoding,
ours (the family's drafts.yaml) and vLLM's own n-gram speculator (the `accel demo`
ngram peer). One prompt set, at every batch size of --batches (its
prompts repeated where the set is smaller than the batch); each round runs every
batch on every engine in turn, the first engine rotating; ratios are the median of
the rounds' paired ratios. Printed per batch: plain tok/s, ours, ngram, their ratios and the control's,
and the controller's own view of that batch bucket (``DomainProposer.step_stats``:
its gate, predicted and measured speedup), so the table shows where drafting stops
paying and whether the controller follows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accel_plugin.cli.common import int_list_arg
from accel_plugin.demo.compare import CONTROL, step_lines
from accel_plugin.demo.family import FamilyError, default_models_dir
from accel_plugin.demo.peers import PEERS
from accel_plugin.demo.plan import open_prompt_set
from accel_plugin.demo.report import engine_lines, paired_ratio, summarise
from accel_plugin.diagnostics.host import cpu_info, cpu_line

BATCHES = (1, 2, 4, 8, 16, 32, 64)


#: An argparse type: comma-separated batch sizes 1..256 (``1,8,64``).
batch_sizes = int_list_arg("batch sizes", 1, 256, "1,8,64")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speculative_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=batch_sizes, default=BATCHES, help="batch sizes (default: 1,2,4,8,16,32,64)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timed batches (default: %(default)s)")
    parser.add_argument("--set", default="support", help="prompt set of the family (default: %(default)s)")
    parser.add_argument("--models", type=Path, default=default_models_dir(), help="demo family folder")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--compile", action="store_true",
                        help="every engine compiled as vLLM's CPU default does (its compilation mode, read back, "
                             "is printed) instead of eager; minutes more per engine at start")
    args = parser.parse_args(argv)
    if args.max_tokens < 1 or args.rounds < 1:
        parser.error("--max-tokens and --rounds must be >= 1")
    return args


def workload(prompts: list[str], batches: tuple[int, ...]) -> tuple[list[list[str]], list[dict]]:
    """(warm-up: the set's last 8 prompts, then each batch size once; timed entries, one per batch size)."""
    def batch(n: int) -> list[str]:
        return [prompts[i % len(prompts)] for i in range(n)]

    warmup = [prompts[-8:]] + [batch(n) for n in batches]
    return warmup, [{"name": f"sweep|{n}|0", "prompts": batch(n)} for n in batches]


def last_step_stats(results: dict[str, dict]) -> dict:
    """Our engine's ``step_stats`` at the end of the run (per batch bucket, its mixes inside)."""
    return next((r.get("step_stats") for r in reversed(results["ours"]["runs"]) if r.get("step_stats")), None) or {}


def rows_from(results: dict[str, dict], batches: tuple[int, ...], step: dict | None = None) -> list[dict]:
    """One row per batch size; ``step``: our engine's step_stats (default: :func:`last_step_stats`)."""
    plain, ours, ngram = (summarise(results[n]) for n in ("plain", "ours", "ngram"))
    control = summarise(results[CONTROL]) if CONTROL in results else None
    step = last_step_stats(results) if step is None else step
    rows = []
    for n in batches:
        key = ("sweep", n)
        s = step.get(str(n)) or {}
        rows.append({"batch": n, "plain_tokens_per_s": plain[key]["tokens_per_s"],
                     "ours_tokens_per_s": ours[key]["tokens_per_s"], "ngram_tokens_per_s": ngram[key]["tokens_per_s"],
                     "ratio_ours": paired_ratio(plain[key], ours[key]),
                     "ratio_ngram": paired_ratio(plain[key], ngram[key]),
                     "ratio_control": paired_ratio(plain[key], control[key]) if control else None,
                     "gate": s.get("gate"), "predicted": s.get("predicted_speedup"),
                     "measured": s.get("measured_speedup")})
    return rows


def render(rows: list[dict]) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    head = (f"{'batch':>5} {'plain tok/s':>11} {'ours':>8} {'ngram':>8} {'ours x':>7} {'ngram x':>8} {'control':>8}  "
            f"{'gate':<7} {'pred':>5} {'meas':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} {r['ours_tokens_per_s']:>8.1f} "
                     f"{r['ngram_tokens_per_s']:>8.1f} {f(r['ratio_ours'], '.2f') + 'x':>7} "
                     f"{f(r['ratio_ngram'], '.2f') + 'x':>8} {f(r.get('ratio_control'), '.2f') + 'x':>8}  "
                     f"{r['gate'] or '-':<7} {f(r['predicted'], '.2f'):>5} "
                     f"{f(r['measured'], '.2f'):>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from accel_plugin.adapters.vllm.demo import run_side_by_side

    args = parse_args(argv)
    try:
        family, target, prompts = open_prompt_set(args.models, args.set)
    except FamilyError as exc:
        raise SystemExit(str(exc)) from None
    warmup, timed = workload(prompts, args.batches)
    configs = {CONTROL: None, "plain": None, "ours": family.config_path("tuned"), "ngram": dict(PEERS["ngram"])}
    most = max(args.batches)
    results = run_side_by_side(target, configs, warmup=warmup, timed=timed, repeats=args.rounds,
                               max_tokens=args.max_tokens, ignore_eos=family.ignore_eos,
                               max_model_len=family.max_model_len, max_num_seqs=max(16, most),
                               kv_cache_mib=max(128, most * 256 * 48 // 1024), compile=args.compile,
                               progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    step = last_step_stats(results)
    rows = rows_from(results, args.batches, step)
    print(f"{family.name}, set {args.set}, {args.max_tokens} tokens per prompt, {args.rounds} rounds, "
          f"{'compiled' if args.compile else 'eager'} engines; "
          "ratios: median of paired rounds; gate/pred/meas: the controller's step model per batch bucket")
    print(f"machine: {cpu_line()}")
    print("\n".join(engine_lines(results)))
    print(render(rows))
    print("the controller at the end of the run, per batch bucket and domain mix:")
    print("\n".join(step_lines(step)))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "step_stats": step, "cpu": cpu_info()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
