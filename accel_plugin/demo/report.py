"""The numbers of `accel demo`: per-run summaries, paired ratios, verdicts, the table.

Framework-neutral: it reads the results that the adapter's side-by-side harness
(``accel_plugin.adapters.vllm.demo.run_side_by_side``) returns, as plain dicts.

- tok/s of a run: its generated tokens over the median of its rounds' times;
- the ratio of a configuration to plain decoding: the median of the per-round
  paired ratios (in a round both engines ran the same prompts back to back, so a
  slow spell of a shared machine tends to hit both sides of a pair);
- the poor-draft figure: all rounds' time together, the first included, because
  that is where the controller learns (its cost counts from the first request);
- predicted speedup: the controller's own formula, S = E(a, k) / (1 + k c + v),
  from the acceptance, k, c and v it measured at that batch size.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..diagnostics.host import cpu_line

__all__ = ["GOALS", "build_report", "paired_ratio", "per_round_ratios", "render", "summarise", "verdicts"]

#: the goals of `accel demo` (issue 10), checked against what is measured, never assumed
GOALS = {
    "support_b1": 1.6,   # tuned draft, batch 1, tokens/s vs plain vLLM
    "support_b8": 1.2,   # tuned draft, batch 8
    "poor_draft": 0.95,  # the goal domain with its untuned draft, learning phase included
    "acceptance_gain": 0.15,  # tuned minus untuned acceptance on held-out prompts
    "predicted_share": 0.8,   # measured speedup / the formula's prediction
}
BATCH_SIZES = (1, 8)
#: c of one draft measured by two engines "agrees" within this factor
C_AGREEMENT = 1.5


def summarise(result: dict, routed: dict[str, list[str]] | None = None) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (domain label, batch size): generated tokens; ``rounds``, the seconds its
    runs took in each round; ``seconds``, the median round; with speculation the
    proposer's counters over all rounds and, for the domains the label's prompts are
    ``routed`` to, the controller's state, k and costs at that batch size after the
    last round (``drafted``/``accepted``: their draft models' or no-draft entries';
    ``lookup_drafted``/``lookup_accepted``: their prompt lookups', whose state, k, cap
    and prediction at that batch size are under ``lookups``, per domain)."""
    from ..speculative.lookup import lookup_entry

    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run in result["runs"]:
        label, batch, _ = run["name"].split("|")
        entry = out.setdefault((label, int(batch)), {
            "generated": 0, "rounds": [], "drafted": 0, "accepted": 0, "steps": 0, "lookup_drafted": 0,
            "lookup_accepted": 0, "token_ids": [], "domains": {}, "lookups": {}, "propose_steps": 0,
            "propose_seconds": 0.0, "repeats_identical": True})
        entry["generated"] += run["generated"]
        times = run.get("seconds_all") or [run["seconds"]]
        entry["rounds"] = [a + b for a, b in zip(entry["rounds"], times)] if entry["rounds"] else list(times)
        entry["token_ids"] += run["token_ids"]
        entry["repeats_identical"] &= bool(run.get("repeats_identical", True))
        entry["propose_steps"] += run.get("propose_steps", 0)
        entry["propose_seconds"] += run.get("propose_seconds", 0.0)
        entry["step_stats"] = run.get("step_stats")
        stats = run.get("stats") or {}
        for domain in (routed or {}).get(label, []):
            # the domain's prompt lookup (its own controller entry): counted apart from its draft's
            lookup = run.get("delta", {}).get(lookup_entry(domain))
            if lookup is not None:
                entry["lookup_drafted"] += lookup["drafted"]
                entry["lookup_accepted"] += lookup.get("accepted", 0)
                entry["lookups"][domain] = _entry_at(stats[lookup_entry(domain)], int(batch), lookup,
                                                     entry["lookups"].get(domain, {}))
            d = run.get("delta", {}).get(domain)
            if d is None:
                continue
            for key in ("steps", "drafted", "accepted"):
                entry[key] += d[key]
            entry["domains"][domain] = _entry_at(stats[domain], int(batch), d, entry["domains"].get(domain, {}))
    for entry in out.values():
        entry["seconds"] = statistics.median(entry["rounds"])
        entry["tokens_per_s"] = entry["generated"] / entry["seconds"] if entry["seconds"] else 0.0
        entry["acceptance"] = entry["accepted"] / entry["drafted"] if entry["drafted"] else None
        entry["propose_ms_per_step"] = (1e3 * entry["propose_seconds"] / entry["propose_steps"]
                                        if entry["propose_steps"] else None)
    return out


def _entry_at(s: dict, batch: int, delta: dict, seen: dict) -> dict:
    """One controller entry's (``s``: its ``stats_dict()``) state, k, costs and prediction at ``batch``,
    and its counters on a label's rows, every round (``seen`` so far plus this run's ``delta``); for a
    capped prompt lookup, ``cap``: ``lifted``, ``capped`` or ``pinned`` (taken back for good) there."""
    at = (s.get("costs_by_bucket") or {}).get(str(batch)) or (s.get("costs_by_bucket") or {}).get(batch)
    out = {"state": (at or s)["state"], "k": (at or s)["k"], "k_max": s["k_max"], "alpha": s["alpha"],
           "c": (at or {}).get("c", s.get("cost_ratio")), "v": (at or {}).get("v", s.get("verify_overhead")),
           "expected_speedup": (at or {}).get("expected_speedup", s.get("expected_speedup")),
           "draft": s.get("draft"),
           "drafted": seen.get("drafted", 0) + delta["drafted"],
           "accepted": seen.get("accepted", 0) + delta["accepted"]}
    if at and "cap_lifted" in at:
        out["cap"] = "lifted" if at["cap_lifted"] else "pinned" if at.get("cap_pinned") else "capped"
    return out


def per_round_ratios(plain: dict, spec: dict) -> list[float]:
    """Speculative over plain tokens/s in each round."""
    return [(spec["generated"] / ts) / (plain["generated"] / tp)
            for tp, ts in zip(plain["rounds"], spec["rounds"]) if tp > 0 and ts > 0]


def paired_ratio(plain: dict, spec: dict) -> float | None:
    """The median of :func:`per_round_ratios` (``None`` without timings)."""
    ratios = per_round_ratios(plain, spec)
    return statistics.median(ratios) if ratios else None


def total_ratio(plain: dict, spec: dict) -> float | None:
    """All rounds together: plain seconds / speculative seconds (same tokens)."""
    tp, ts = sum(plain["rounds"]), sum(spec["rounds"])
    return tp / ts if ts > 0 and plain["generated"] == spec["generated"] else None


def acceptance_pass(result: dict, route: dict[str, dict]) -> dict[str, dict]:
    """Per prompt set of the untimed runs (:class:`.plan.DemoPlan` ``untimed``): its
    prompts, the domains they were routed to, and per domain its draft model's
    ``(drafted, accepted)`` (prompt lookups apart)."""
    from ..speculative.lookup import entry_domain

    out = {}
    for run in result.get("untimed", []):
        label = run["name"].split("|")[0]
        out[label] = {"prompts": len(run["token_ids"]), "routed": route.get(label, {}).get("routed", []),
                      "by_domain": {d: (v["drafted"], v["accepted"]) for d, v in sorted(run["delta"].items())
                                    if entry_domain(d) == d and v["drafted"]}}
    return out


def _predicted(s: dict) -> float | None:
    """The row's one prediction: its draft model's; a row no draft model drafted for, its prompt lookup's."""
    for entries in (s["domains"], s["lookups"] if not s["drafted"] else {}):
        values = [d["expected_speedup"] for d in entries.values() if d.get("expected_speedup") is not None]
        if values:
            return values[0] if len(values) == 1 else None
    return None


def build_report(results: dict[str, dict], routes: dict[str, dict], settings: dict, goal_domain: str,
                 peers: list[str] = ()) -> dict:
    """Everything the table, the verdicts and --json need, from the raw results;
    ``peers``: the configurations that are vLLM's own speculators (no routes)."""
    from .compare import OURS, comparison, goals23

    plain = summarise(results["plain"])
    configs = {}
    for name, result in results.items():
        if name == "plain":
            continue
        route = routes.get(name, {})
        summary = summarise(result, {label: r["routed"] for label, r in route.items()})
        rows = []
        for (label, batch), s in summary.items():
            base = plain[(label, batch)]
            same = sum(a == b for a, b in zip(s["token_ids"], base["token_ids"]))
            rows.append({
                "domain": label, "batch": batch, "routed": route.get(label, {}).get("routed", []),
                "draft": route.get(label, {}).get("draft"),
                "plain_tokens_per_s": base["tokens_per_s"], "spec_tokens_per_s": s["tokens_per_s"],
                "generated": s["generated"],
                "ratio": paired_ratio(base, s), "ratio_per_round": per_round_ratios(base, s),
                "ratio_all_rounds": total_ratio(base, s),
                "drafted": s["drafted"], "accepted": s["accepted"], "acceptance": s["acceptance"],
                "lookup_drafted": s["lookup_drafted"], "lookup_accepted": s["lookup_accepted"],
                "proposer": s["domains"], "lookups": s["lookups"], "predicted_speedup": _predicted(s),
                "propose_ms_per_step": s["propose_ms_per_step"],
                "identical_outputs": same if s["repeats_identical"] and base["repeats_identical"] else 0,
                "outputs": len(s["token_ids"]),
            })
        final = result.get("final") or {}
        configs[name] = {
            "rows": rows,
            "final": {d: {k: v for k, v in st.items() if k not in ("costs_by_bucket",)} for d, st in final.items()},
            "propose_ms_per_step": next((st.get("propose_ms_per_step") for st in final.values()), None),
            "startup_s": result["startup_s"], "warmup_s": result["warmup_s"],
            "attention_backends": result.get("attention_backends"), "method": result.get("method"),
            "step_stats": next((r.get("step_stats") for r in reversed(result["runs"]) if r.get("step_stats")), None),
        }
    compared = comparison(configs, list(peers))
    accepted = acceptance_pass(results.get(OURS, {}), routes.get(OURS, {}))
    return {
        "timing_spread": timing_spread(results),
        "settings": settings,
        "engines": {name: {"attention_backends": r.get("attention_backends"), "parameters": r.get("parameters"),
                           "method": r.get("method"), "compilation": r.get("compilation"),
                           "target_products": r.get("target_products")}
                    for name, r in results.items()},
        "plain": {f"{label}|{batch}": {k: s[k] for k in ("generated", "seconds", "tokens_per_s")}
                  for (label, batch), s in plain.items()},
        "configs": configs,
        "cost_ratios": cost_ratio_agreement(configs),
        "goals": verdicts(configs, goal_domain, lossless_required=settings.get("dtype") == "float32"),
        "peers": list(peers),
        "comparison": compared,
        "acceptance_pass": accepted,
        "goals23": goals23(compared, goal_domain, lossless_required=settings.get("dtype") == "float32",
                           skipped=settings.get("skipped_peers"), acceptance=accepted),
    }


def timing_spread(results: dict[str, dict]) -> dict | None:
    """The largest slowest/fastest ratio among the rounds of one timed run."""
    worst = None
    for name, result in results.items():
        for run in result["runs"]:
            times = run.get("seconds_all") or [run["seconds"]]
            ratio = max(times) / min(times) if min(times) > 0 else None
            if ratio is not None and (worst is None or ratio > worst["ratio"]):
                worst = {"ratio": ratio, "config": name, "run": run["name"]}
    return worst


def cost_ratio_agreement(configs: dict) -> list[dict]:
    """c at batch 1 of each draft as each configuration measured it (from its final
    counters); ``agree`` when the largest is within :data:`C_AGREEMENT` of the smallest
    (``None`` for prompt lookup: its c is host time of about a microsecond per
    drafted position, where two engines 2x apart say nothing about a draft model)."""
    from ..speculative.lookup import LOOKUP_DRAFT

    by_draft: dict[str, dict[str, float]] = {}
    for name, cfg in configs.items():
        for domain, st in cfg["final"].items():
            c = st.get("cost_ratio")
            if st.get("draft") and c is not None:
                by_draft.setdefault(st["draft"], {})[name] = c
    out = []
    for draft, per_config in sorted(by_draft.items()):
        values = list(per_config.values())
        comparable = len(values) >= 2 and draft != LOOKUP_DRAFT
        out.append({"draft": draft, "by_config": per_config,
                    "agree": max(values) <= C_AGREEMENT * min(values) if comparable else None})
    return out


def _row(configs: dict, config: str, domain: str, batch: int) -> dict | None:
    for row in configs.get(config, {}).get("rows", []):
        if row["domain"] == domain and row["batch"] == batch:
            return row
    return None


def _lossless(row: dict) -> bool:
    return row["identical_outputs"] == row["outputs"]


def verdicts(configs: dict, goal_domain: str, *, lossless_required: bool = True) -> list[dict]:
    """One entry per goal: met (True/False, or None = not measured) and the measured value.
    With ``lossless_required`` (float32) a speed goal is met only if every greedy
    output of those runs equals plain decoding's."""
    out = []

    def goal(name: str, value: float | None, target: float, detail: str, rows: list[dict] = ()) -> None:
        met = None if value is None else value >= target
        if met and lossless_required and not all(_lossless(r) for r in rows):
            met, detail = False, detail + "; NOT lossless: outputs differ from plain decoding"
        out.append({"goal": name, "target": target, "measured": value, "met": met, "detail": detail})

    for batch, key in ((1, "support_b1"), (8, "support_b8")):
        row = _row(configs, "tuned", goal_domain, batch)
        goal(f"{goal_domain}, tuned draft, batch {batch}: tokens/s vs plain vLLM",
             row and row["ratio"], GOALS[key],
             f"median of {len(row['ratio_per_round'])} paired rounds" if row else "not measured",
             [row] if row else [])
    poor = [r for b in BATCH_SIZES if (r := _row(configs, "untuned", goal_domain, b))]
    worst = min((r for r in poor if r["ratio_all_rounds"] is not None), key=lambda r: r["ratio_all_rounds"],
                default=None)
    goal(f"poor-draft domain ({goal_domain} with its untuned draft), all rounds incl. learning: worst batch",
         worst and worst["ratio_all_rounds"], GOALS["poor_draft"],
         ", ".join(f"batch {r['batch']} {r['ratio_all_rounds']:.2f}x (rounds "
                   + " ".join(f"{x:.2f}" for x in r["ratio_per_round"]) + ")" for r in poor)
         if poor else "not measured (no untuned configuration)", poor)
    tuned = [r for b in BATCH_SIZES if (r := _row(configs, "tuned", goal_domain, b))]

    def pooled(rows: list[dict]) -> float | None:
        drafted = sum(r["drafted"] for r in rows)
        return sum(r["accepted"] for r in rows) / drafted if drafted else None

    a_t, a_u = pooled(tuned), pooled(poor)
    goal(f"{goal_domain} acceptance on held-out prompts: tuned minus untuned draft (in vLLM)",
         None if a_t is None or a_u is None else a_t - a_u, GOALS["acceptance_gain"],
         "not measured" if a_t is None or a_u is None else f"{a_t:.2f} vs {a_u:.2f}")
    for row in tuned:
        predicted = row["predicted_speedup"]
        share = None if not predicted or row["ratio"] is None else row["ratio"] / predicted
        goal(f"{goal_domain}, tuned, batch {row['batch']}: measured / predicted speedup",
             share, GOALS["predicted_share"],
             "no prediction (controller off or costs unmeasured)" if share is None
             else f"measured {row['ratio']:.2f}x, formula {predicted:.2f}x")
    return out


# ---------------------------------------------------------------- rendering


def _fmt(value: float | None, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def engine_lines(engines: dict[str, dict]) -> list[str]:
    """What each engine really ran, as read back from vLLM (``run_side_by_side``'s results or the
    report's ``engines``): its attention backend, speculative method and compilation mode, and with our proposer
    what the target's matrices multiply by."""
    lines = ["attention backend each engine used (read back): " + "; ".join(
        f"{name} {', '.join(e.get('attention_backends') or ['?'])}"
        + "".join(f" ({what} {e[key]})" for what, key in (("method", "method"), ("compilation", "compilation"))
                  if e.get(key)) for name, e in engines.items())]
    return lines + [f"target products of {name} (read back): {'; '.join(e['target_products'])}"
                    for name, e in engines.items() if e.get("target_products")]


def render(report: dict, titles: dict[str, str]) -> str:
    from .compare import CONTROL, config_lines, render_comparison

    lines = []
    st = report["settings"]
    plain_engine = report["engines"].get("plain", {})
    params = plain_engine.get("parameters")
    lines.append(
        f"target {st['target_name']} ({_fmt(params and params / 1e6, '.1f')}M parameters, read back from vLLM), "
        f"{st['dtype']}, {'compiled' if st.get('compile') else 'eager'} engines, "
        f"k_max {st['num_speculative_tokens']}, up to {st['max_tokens']} tokens per prompt"
        f"{' (ends at end of answer)' if not st.get('ignore_eos', True) else ''}; batch 1 = {st['batch1_prompts']} "
        f"prompts one at a time, batch 8 = 8 prompts together; {st['repeats']} round(s)")
    cpu = (st.get("machine") or {}).get("cpu")
    if cpu:
        lines.append(f"machine: {cpu_line(cpu)}")
    lines += engine_lines(report["engines"])
    lines.append("tok/s = the median round; ratio = the median of the rounds' paired ratios; pred = the "
                 "controller's formula at that batch size (the draft model's; where none drafted, the prompt "
                 "lookup's); accepted/drafted, k, c, v, state: the draft models'; lookup: the prompt lookups' "
                 "tokens, state, k and whether a capped lookup's cap is lifted; propose ms = the whole "
                 "propose() call per step")
    for name, cfg in report["configs"].items():
        if name in report.get("peers", ()) or name == CONTROL:
            continue
        lines.append("")
        lines.append(titles.get(name, name))
        lines += config_lines(cfg)
    if "comparison" in report:
        lines += render_comparison(report["comparison"], report.get("peers", []),
                                   st.get("skipped_peers") or {})
    if report.get("cost_ratios"):
        lines.append("")
        lines.append("cost ratio c of each draft (batch 1), per configuration: " + "; ".join(
            f"{entry['draft'].rstrip('/').split('/')[-1]}: "
            + ", ".join(f"{cfg} {c:.3f}" for cfg, c in entry["by_config"].items())
            + ("" if entry["agree"] is None else (" (agree)" if entry["agree"] else " (DISAGREE)"))
            for entry in report["cost_ratios"]))
    spread = report.get("timing_spread")
    if spread and st["repeats"] > 1:
        lines.append(f"timing: the slowest round of one run took up to {spread['ratio']:.2f}x its fastest "
                     f"({spread['config']}, {spread['run']})")
    lines.append("")
    lines.append("Goals (measured above, not assumed):")
    for g in report["goals"]:
        status = {True: "MET   ", False: "MISSED", None: "n/a   "}[g["met"]]
        lines.append(f"  [{status}] {g['goal']}: {_fmt(g['measured'], '.2f')} (goal >= {g['target']}; {g['detail']})")
    if report.get("goals23"):
        lines.append("")
        lines.append("Goals of issue 23 (measured above, not assumed):")
        for g in report["goals23"]:
            status = {True: "MET   ", False: "MISSED", None: "n/a   "}[g["met"]]
            lines.append(f"  [{status}] {g['goal']}: {_fmt(g['measured'], '.2f')} (goal >= {g['target']}; "
                         f"{g['detail']})")
    return "\n".join(lines)
