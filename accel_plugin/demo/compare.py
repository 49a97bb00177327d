"""`accel demo` against vLLM's own speculators: per prompt set and batch size,
plain, ours (the tuned drafts) and each peer, verdicts, and the goals of issue 23.

Framework-neutral; reads :func:`.report.build_report`'s ``configs`` (rows with the
median paired ratio to plain decoding). A row is "ahead of every peer" when ours >=
the best peer's ratio - :data:`PEER_MARGIN`, "never slower" when ours >=
:data:`NEVER_SLOWER` x plain.

The control (:data:`CONTROL`) is a second plain engine with the same settings, started
before every other engine: its ratio to plain is what two identical engines read
against each other on the same rows (on the 2-core CPU up to about 5% either way, the
same sign round after round: a property of the engine process, not of the round; the
first engine started read 3-10% slower than later ones, so the baseline is never the
first). It is printed beside every row and its spread beside the never-slower goal; it
changes no verdict.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTROL", "FREE_SET", "GOALS23", "NEVER_SLOWER", "PEER_MARGIN", "comparison", "control_spread",
           "config_lines", "goals23", "render_comparison", "step_lines"]

NEVER_SLOWER = 0.98
PEER_MARGIN = 0.02
#: issue 23's speed goals for the goal domain with the tuned drafts
GOALS23 = {"support_b1": 1.8, "support_b8": 1.2, "free_acceptance_gap": 0.1}
OURS = "tuned"
#: the configuration name of the second plain engine
CONTROL = "plain-again"
#: the prompt set of support questions written in another style than the tuning templates
FREE_SET = "support-free"


def _rows(configs: dict, name: str) -> dict[tuple[str, int], dict]:
    return {(r["domain"], r["batch"]): r for r in configs.get(name, {}).get("rows", [])}


def comparison(configs: dict, peers: list[str]) -> list[dict[str, Any]]:
    """One row per (prompt set, batch) that ours ran: plain and ours tok/s, each peer's
    tok/s and ratio, the best peer, the verdicts, whether every output was lossless."""
    ours, control = _rows(configs, OURS), _rows(configs, CONTROL)
    by_peer = {p: _rows(configs, p) for p in peers}
    out = []
    for key, row in ours.items():
        peer = {p: by_peer[p].get(key) for p in peers}
        ratios = {p: r["ratio"] for p, r in peer.items() if r and r["ratio"] is not None}
        best = max(ratios, key=ratios.get) if ratios else None
        ratio = row["ratio"]
        out.append({
            "domain": key[0], "batch": key[1], "plain_tokens_per_s": row["plain_tokens_per_s"],
            "ours_tokens_per_s": row["spec_tokens_per_s"], "ours_ratio": ratio,
            "peers": {p: None if r is None else {"tokens_per_s": r["spec_tokens_per_s"], "ratio": r["ratio"],
                                                 "lossless": r["identical_outputs"] == r["outputs"]}
                      for p, r in peer.items()},
            "best_peer": best,
            "ahead_of_peers": None if ratio is None else (best is None or ratio >= ratios[best] - PEER_MARGIN),
            "never_slower": None if ratio is None else ratio >= NEVER_SLOWER,
            "lossless": row["identical_outputs"] == row["outputs"],
            "acceptance": row["acceptance"],
            #: per domain its prompts were routed to: (draft tokens, accepted) of its draft model on these rows
            "by_domain": {d: (v.get("drafted", 0), v.get("accepted", 0)) for d, v in (row.get("proposer") or {}).items()},
            "routed": row.get("routed", []),
            #: draft tokens of every kind (draft models and prompt lookups) in its timed runs
            "drafted": None if row.get("drafted") is None else row["drafted"] + row.get("lookup_drafted", 0),
            #: the second plain engine's ratio to plain on this row (None: no control)
            "control_ratio": (control.get(key) or {}).get("ratio"),
        })
    return out


def control_spread(rows: list[dict]) -> tuple[float, float] | None:
    """(lowest, highest) ratio of the control over the rows (None: no control ran)."""
    values = [r["control_ratio"] for r in rows if r.get("control_ratio") is not None]
    return (min(values), max(values)) if values else None


def _goal(name: str, value: float | None, target: float, detail: str) -> dict:
    return {"goal": name, "target": target, "measured": value, "met": None if value is None else value >= target - 1e-9,
            "detail": detail}


def goals23(rows: list[dict], goal_domain: str, *, free_set: str = FREE_SET, repeat_set: str = "repeat",
            lossless_required: bool = True, skipped: dict[str, str] | None = None,
            acceptance: dict[str, dict] | None = None) -> list[dict]:
    """The goals of issue 23 from the :func:`comparison` rows (and ``acceptance``, the
    untimed pass over whole prompt sets: :func:`.report.acceptance_pass`): met
    True/False, None = not measured."""
    at = {(r["domain"], r["batch"]): r for r in rows}
    out = []
    ratios = [r["ours_ratio"] for r in rows if r["ours_ratio"] is not None]
    idle = sum(1 for r in rows if r["never_slower"] is False and r.get("drafted") == 0)
    spread = control_spread(rows)
    out.append(_goal(f"every row: ours >= {NEVER_SLOWER}x plain (worst row)", min(ratios, default=None), NEVER_SLOWER,
                     f"{sum(bool(r['never_slower']) for r in rows)}/{len(rows)} rows"
                     + (f"; {idle} of the rows below drafted no token (plain's work)" if idle else "")
                     + ("" if spread is None else f"; a second plain engine read {spread[0]:.2f}-{spread[1]:.2f}x "
                        "plain on the same rows")))
    gaps = [r["ours_ratio"] - r["peers"][r["best_peer"]]["ratio"] for r in rows
            if r["best_peer"] and r["ours_ratio"] is not None]
    out.append(_goal(f"every row: ours >= best peer - {PEER_MARGIN} (worst margin over the best peer)",
                     min(gaps, default=None), -PEER_MARGIN,
                     f"{sum(bool(r['ahead_of_peers']) for r in rows if r['best_peer'])}/{len(gaps)} rows"
                     + "".join(f"; {p} not run ({why})" for p, why in (skipped or {}).items())))
    for batch, key in ((1, "support_b1"), (8, "support_b8")):
        r = at.get((goal_domain, batch))
        out.append(_goal(f"{goal_domain}, tuned, batch {batch}: tokens/s vs plain", r and r["ours_ratio"],
                         GOALS23[key], "median of paired rounds" if r else "not measured"))
    diffs = []
    for batch in (1, 8):
        r = at.get((repeat_set, batch))
        ngram = r and (r["peers"].get("ngram") or {}).get("ratio")
        if r and r["ours_ratio"] is not None and ngram is not None:
            diffs.append((batch, r["ours_ratio"] - ngram))
    out.append(_goal(f"{repeat_set}: ours >= n-gram's ratio at batch 1 and 8 (worst difference)",
                     min((d for _, d in diffs), default=None), 0.0,
                     ", ".join(f"batch {b} {d:+.2f}" for b, d in diffs) or f"not measured (needs the {repeat_set} "
                     "set and the ngram peer)"))
    out.append(_free_style_goal(at, goal_domain, free_set, acceptance or {}))
    flat = [r["lossless"] for r in rows] + [r["peers"]["ngram"]["lossless"] for r in rows if r["peers"].get("ngram")]
    out.append(_goal("greedy outputs identical to plain in every row (ours and the ngram peer)",
                     (sum(flat) / len(flat) if flat else None) if lossless_required else None, 1.0,
                     f"{sum(flat)}/{len(flat)} runs identical" if lossless_required else "not required (not float32)"))
    return out


def _free_style_goal(at: dict, goal_domain: str, free_set: str, acceptance: dict[str, dict]) -> dict:
    """The goal domain's draft on the free-style set against the templated one: from the
    untimed pass over both whole sets where it ran, else from the timed rows (draft
    tokens pooled over batch 1 and 8; a batch whose gate is off drafts a few probe tokens)."""
    whole = free_set in acceptance and goal_domain in acceptance

    def counts(name: str) -> dict[str, list[tuple[int, int]]]:
        if whole:
            return {d: [v] for d, v in acceptance[name]["by_domain"].items()}
        out: dict[str, list[tuple[int, int]]] = {}
        for b in (1, 8):
            for d, v in (at.get((name, b)) or {}).get("by_domain", {}).items():
                out.setdefault(d, []).append(tuple(v))
        return out

    def pooled(name: str, domains: set | None) -> tuple[float | None, int]:
        pairs = [v for d, vs in counts(name).items() if domains is None or d in domains for v in vs]
        drafted = sum(n for n, _ in pairs)
        return (sum(a for _, a in pairs) / drafted if drafted else None), drafted

    (a_free, n_free), (a_tmpl, n_tmpl) = pooled(free_set, {goal_domain}), pooled(goal_domain, {goal_domain})
    (all_free, _), (all_tmpl, _) = pooled(free_set, None), pooled(goal_domain, None)
    routed = (acceptance[free_set]["routed"] if whole
              else sorted({d for b in (1, 8) for d in (at.get((free_set, b)) or {}).get("routed", [])}))
    source = (f"every prompt of each set ({acceptance[free_set]['prompts']} and {acceptance[goal_domain]['prompts']}) "
              "at batch 1, untimed" if whole else "the timed rows, batch 1 and 8")
    return _goal(f"{free_set} acceptance within {GOALS23['free_acceptance_gap']} of templated {goal_domain} "
                 f"(the {goal_domain} draft)",
                 None if a_free is None or a_tmpl is None else a_free - a_tmpl, -GOALS23["free_acceptance_gap"],
                 "not measured" if a_free is None or a_tmpl is None else
                 f"{a_free:.2f} vs {a_tmpl:.2f} ({n_free} and {n_tmpl} draft tokens; {source}); every draft "
                 f"{_f(all_free, '.2f')} vs {_f(all_tmpl, '.2f')} ({free_set} routed to {'+'.join(routed)})")


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _lookup_part(row: dict, lookups: dict) -> str:
    """A table row's prompt lookups: their tokens, and per lookup its state, k and cap at the row's batch."""
    if not lookups:
        return ""
    caps = {"lifted": " cap lifted", "capped": " capped", "pinned": " capped (taken back)"}
    each = ", ".join(f"{x['state']} k={x['k']}{caps.get(x.get('cap'), '')}" for x in lookups.values())
    return f"; lookup {row.get('lookup_accepted', 0)}/{row.get('lookup_drafted', 0)} {each}"


def config_lines(cfg: dict) -> list[str]:
    """One configuration's table (:func:`.report.build_report`'s ``configs[name]``): a line per
    prompt set and batch size, then the controller and the step model at the end."""
    lines = []
    header = (f"  {'domain':<8} {'routed->draft':<34} {'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} "
              f"{'ratio':>6} {'pred':>5} {'accepted/drafted':>17} {'accept':>6} {'k':>3} {'c':>6} {'v':>5} "
              f"{'propose ms':>10}  state")
    lines.append(header)
    lines.append("  " + "-" * (len(header) - 2))
    for r in cfg["rows"]:
        lookups = r.get("lookups") or {}
        routed = f"{'/'.join(r['routed'])}->{r['draft'] or ('lookup' if lookups else 'none')}"
        d = list(r["proposer"].values())
        one = d[0] if len(d) == 1 else {}
        lines.append(
            f"  {r['domain']:<8} {routed:<34} {r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} "
            f"{r['spec_tokens_per_s']:>10.1f} {_f(r['ratio'], '.2f') + 'x':>6} "
            f"{_f(r['predicted_speedup'], '.2f'):>5} "
            f"{(str(r['accepted']) + '/' + str(r['drafted'])):>17} {_f(r['acceptance'], '.2f'):>6} "
            f"{','.join(str(x['k']) for x in d) or '-':>3} {_f(one.get('c'), '.3f'):>6} "
            f"{_f(one.get('v'), '.2f'):>5} {_f(r['propose_ms_per_step'], '.2f'):>10}  "
            f"{', '.join(x['state'] for x in d) or '-'}{_lookup_part(r, lookups)}"
        )
    same = sum(r["identical_outputs"] for r in cfg["rows"])
    total = sum(r["outputs"] for r in cfg["rows"])
    lines.append("  controller at the end: " + "; ".join(
        f"{d} {s['state']} k={s['k']}/{s['k_max']} alpha={_f(s['alpha'], '.2f')} "
        f"c={_f(s.get('cost_ratio'), '.3f')} (size {_f(s.get('cost_ratio_size'), '.3f')}) "
        f"v={_f(s.get('verify_overhead'), '.2f')}"
        for d, s in cfg["final"].items() if s.get("draft")))
    lines.append(f"  propose() {_f(cfg['propose_ms_per_step'], '.1f')} ms per step; greedy outputs identical "
                 f"to plain decoding (every round): {same}/{total}")
    lines.append("  controller's step model at the end (predicted vs measured per batch bucket):")
    lines += step_lines(cfg.get("step_stats"))
    return lines


def render_comparison(rows: list[dict], peers: list[str], skipped: dict[str, str]) -> list[str]:
    """The side-by-side table: per set and batch, plain, ours and each peer."""
    control = any(r.get("control_ratio") is not None for r in rows)
    head = f"  {'set':<13} {'batch':>5} {'plain tok/s':>11} {'ours':>7} {'ratio':>6}" + (" control" if control else "")
    for p in peers:
        head += f" {p:>7} {p + ' x':>8}"
    head += "  verdict"
    lines = ["", "ours (tuned drafts) beside vLLM's own speculators", head, "  " + "-" * (len(head) - 2)]
    for r in rows:
        line = (f"  {r['domain']:<13} {r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} {r['ours_tokens_per_s']:>7.1f} "
                f"{_f(r['ours_ratio'], '.2f') + 'x':>6}" + (f" {_f(r.get('control_ratio'), '.2f') + 'x':>7}"
                                                             if control else ""))
        for p in peers:
            v = r["peers"].get(p)
            line += f" {_f(v and v['tokens_per_s'], '.1f'):>7} {_f(v and v['ratio'], '.2f') + 'x':>8}"
        verdict = [("ahead of every peer" if r["ahead_of_peers"] else f"behind {r['best_peer']}")
                   if r["best_peer"] else "no peer", "never slower" if r["never_slower"] else "SLOWER than plain"
                   + (" (drafted no token)" if r.get("drafted") == 0 else "")]
        if not r["lossless"]:
            verdict.append("outputs DIFFER")
        lines.append(line + "  " + ", ".join(verdict))
    lines += [f"  {p}: not run ({why})" for p, why in skipped.items()]
    if control:
        low, high = control_spread(rows)
        lines.append(f"  control = a second plain engine, same settings, started first of all, against plain: "
                     f"{low:.2f}-{high:.2f}x over these rows (two identical engines: this machine's "
                     "engine-to-engine spread)")
    return lines


def _x(stats: dict, key: str) -> str:
    return "" if stats.get(key) is None else "x"


def step_lines(step_stats: dict | None) -> list[str]:
    """Predicted vs measured per batch bucket, from ``DomainProposer.step_stats``."""
    if not step_stats:
        return ["  step model: not reported by this proposer (no step_stats)"]
    lines = []
    for bucket in sorted(step_stats, key=int):
        s = step_stats[bucket] or {}
        lines.append(f"  batch {bucket}: predicted {_f(s.get('predicted_speedup'), '.2f')}{_x(s, 'predicted_speedup')}, "
                     f"measured {_f(s.get('measured_speedup'), '.2f')}{_x(s, 'measured_speedup')}, gate {s.get('gate') or '-'}; per drafting step "
                     f"propose() host {_f(s.get('host_ms'), '.2f')} ms beside draft forward "
                     f"{_f(s.get('draft_ms'), '.2f')} ms ({s.get('steps') or 0} steps, "
                     f"{s.get('samples') or 0} samples)")
        for name, m in (s.get("mixes") or {}).items():  # the gate's verdict per domain mix
            if name == "-" or not m.get("steps"):
                continue
            tail = m.get("tail_factor")
            inherited = "" if not m.get("inherited") else f" (from batch {m['inherited']})" if int(
                m["inherited"]) < int(bucket) else " (each of its domains off alone)"
            lines.append(f"    mix {name}: gate {m.get('gate') or '-'}{inherited}, measured {_f(m.get('measured_speedup'), '.2f')}"
                         f"{_x(m, 'measured_speedup')}, whole batches x{_f(tail, '.2f')} tail, "
                         f"{_f(m.get('whole_speedup'), '.2f')}{_x(m, 'whole_speedup')} drafting "
                         f"({m.get('steps')} steps, {m.get('samples') or 0} samples)")
    return lines
