"""Per-domain acceptance benchmark of a draft YAML against a target (``accel bench acceptance``).

Prompts are routed to domains as the proposer routes them (the YAML's keywords and
regexes, :class:`~accel_plugin.speculative.router.DomainRouter`); labels in a JSONL
prompt file are only counted. Per domain with a draft: greedy acceptance per
position and overall, mean acceptance length, the cost ratio ``c``, the ``k`` with
the largest expected speedup, the break-even acceptance at that ``k``, and the
expected (formula) and simulated (replayed rounds x measured step times) speedup
for every ``k`` up to the domain's ``k_max``.

:func:`run_acceptance` is the whole of ``accel bench acceptance`` given a
:class:`~accel_plugin.tuning.settings.BenchSettings` (checks of the inputs, the
benchmark, the plot); :func:`format_table` renders its report.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..speculative.speedup import best_k, expected_speedup
from .acceptance import (
    break_even_alpha,
    greedy_continuation,
    greedy_continuations,
    match_flags,
    measure_step_ms,
    simulate,
    simulated_speedup,
)
from .errors import TuningError
from .prompts import Prompt
from .settings import BenchSettings

__all__ = ["bench_acceptance", "format_table", "plot_speedup", "run_acceptance"]


def run_acceptance(settings: BenchSettings) -> dict:
    """Check the inputs, run :func:`bench_acceptance`, draw the plot; returns the report
    (with ``plot``: the PNG's path, when one was asked for). Raises :class:`TuningError`."""
    from ..speculative.draft_config import DraftConfigError, load_draft_config
    from .loaders import check_model_dir
    from .prompts import read_prompts

    if not Path(settings.config).is_file():
        raise TuningError(f"--config: draft YAML {str(settings.config)!r} does not exist")
    try:
        config = load_draft_config(settings.config)
    except DraftConfigError as exc:
        raise TuningError(f"--config: {exc}") from None
    target = check_model_dir(settings.target, "--target", need_tokenizer=True)
    prompts = read_prompts(settings.prompts)
    if settings.plot and not str(settings.plot).lower().endswith(".png"):
        raise TuningError(f"--plot: expected a .png file name; got {str(settings.plot)!r}")
    if settings.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise TuningError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    report = bench_acceptance(config, target, prompts, gen_tokens=settings.gen_tokens,
                              max_prompts=settings.max_prompts, chat=settings.chat,
                              target_step_ms=settings.target_step_ms, k_max=settings.k_max)
    if settings.plot:
        report["plot"] = str(plot_speedup(report, settings.plot))
    return report


def bench_acceptance(config, target_dir: Path, prompts: list[Prompt], *, gen_tokens: int = 64,
                     max_prompts: int | None = None, target_step_ms: float | None = None,
                     k_max: int | None = None, progress=None, chat: bool = False) -> dict:
    """Run the benchmark; ``config`` is a loaded :class:`~accel_plugin.speculative.draft_config.schema.DraftConfig`."""
    from ..speculative.router import DomainRouter
    from .loaders import check_model_dir, check_same_vocabulary, load_draft_model, load_lm, load_tokenizer

    router = DomainRouter.from_config(config)
    drafts = config.drafts()
    groups: dict[str, list[Prompt]] = {d: [] for d in router.domains}
    for p in prompts:
        groups[router.route(p.text)].append(p)
    for draft in {d for d in drafts.values() if d}:
        check_same_vocabulary(target_dir, check_model_dir(draft, "--config"), draft_flag=f"--config (draft {draft})")

    tokenizer = load_tokenizer(target_dir)
    if chat:  # route and continue the prompts as the server sees them: in the chat template
        prompts = [Prompt(tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                                        add_generation_prompt=True), p.label) for p in prompts]
        groups = {d: [] for d in router.domains}
        for p in prompts:
            groups[router.route(p.text)].append(p)
    target = load_lm(target_dir)
    measured_target = target_step_ms is None
    used = sorted({drafts[d] for d, m in groups.items() if m and drafts[d]})
    # drafts and target take turns, so the machine's load hits them alike
    draft_ms = measure_step_ms(used + ([str(target_dir)] if measured_target else []), target_dir=target_dir)
    if measured_target:
        target_step_ms = draft_ms[str(target_dir)]
    results = []
    for domain, members in groups.items():
        if not members:
            continue
        if max_prompts:
            members = members[:max_prompts]
        draft = drafts[domain]
        row = {"domain": domain, "draft": draft, "prompts": len(members),
               "labels": dict(Counter(p.label for p in members if p.label))}
        if draft is None:
            row["note"] = "no draft: no speculation"
            results.append(row)
            continue
        k_top = k_max or config.k_max(domain)
        model = load_draft_model(Path(draft), target_dir)
        flags = []
        for p in members:
            ids = tokenizer(p.text, add_special_tokens=False)["input_ids"][-256:]
            if not ids:
                continue
            if chat and tokenizer.eos_token_id is not None:  # a served answer ends at its end-of-turn token
                cont = greedy_continuations(target, [ids], gen_tokens, stop_ids=frozenset([tokenizer.eos_token_id]))[0]
            else:
                cont = greedy_continuation(target, ids, gen_tokens)
            flags.append(match_flags(model, ids, cont))
            if progress:
                progress(1)
        c = draft_ms[draft] / target_step_ms
        top = simulate(flags, k_top)
        curve = []
        for k in range(1, k_top + 1):
            stats = top if k == k_top else simulate(flags, k)
            curve.append({"k": k, "alpha": stats.alpha, "mean_acceptance_length": stats.mean_acceptance_length,
                          "expected_speedup": expected_speedup(top.alpha, k, c),
                          "simulated_speedup": simulated_speedup(stats, draft_ms[draft], target_step_ms)})
        k_best, s_best = best_k(top.alpha, c, k_top)
        chosen = curve[k_best - 1] if k_best else None
        row.update({
            "k_max": k_top, "alpha": top.alpha, "per_position": top.per_position,
            "mean_acceptance_length": top.mean_acceptance_length,
            "draft_step_ms": draft_ms[draft], "target_step_ms": target_step_ms, "c": c,
            "best_k": k_best, "break_even_alpha": break_even_alpha(max(k_best, 1), c),
            "expected_speedup": s_best, "simulated_speedup": chosen["simulated_speedup"] if chosen else 1.0,
            "curve": curve,
        })
        results.append(row)
    if not results:
        raise TuningError("--prompts: no prompt reached any domain")
    return {
        "target": str(target_dir), "gen_tokens": gen_tokens, "target_step_ms": target_step_ms,
        "target_step_source": "measured (lean forward, 1 token, batch 1)" if measured_target else "given (--target-step-ms)",
        "domains": results,
    }


def plot_speedup(report: dict, path: str | Path) -> Path:
    """PNG: expected (line) and simulated (markers) speedup vs k per domain, S = 1 dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    k_top = 1
    for i, row in enumerate(r for r in report["domains"] if r.get("curve")):
        color = f"C{i}"
        ks = [0] + [p["k"] for p in row["curve"]]
        k_top = max(k_top, ks[-1])
        ax.plot(ks, [1.0] + [p["expected_speedup"] for p in row["curve"]], "-", color=color,
                label=f"{row['domain']} (alpha {row['alpha']:.2f}, c {row['c']:.2f})")
        ax.plot(ks, [1.0] + [p["simulated_speedup"] for p in row["curve"]], "o", color=color, markersize=4)
        if row["best_k"]:
            ax.plot([row["best_k"]], [row["expected_speedup"]], "*", color=color, markersize=12)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="break-even (S = 1)")
    ax.set_xlabel("k (tokens drafted per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_xticks(range(0, k_top + 1))
    ax.set_title("Expected (lines) and simulated (dots) speedup; * = chosen k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def format_table(report: dict) -> str:
    """The report of :func:`run_acceptance` as text: a row per domain, acceptance per
    position, expected (and simulated) speedup by k."""
    rows = report["domains"]
    lines = [
        f"target step {report['target_step_ms']:.2f} ms ({report['target_step_source']}); "
        f"{report['gen_tokens']} target tokens per prompt; greedy",
        "",
    ]
    head = ("domain", "draft", "prompts", "alpha", "mean acc.len", "c", "best k", "break-even", "expected S", "simulated S")
    table = [head]
    for r in rows:
        draft = Path(r["draft"]).name if r["draft"] else "(none)"
        if "curve" not in r:
            table.append((r["domain"], draft, str(r["prompts"]), "-", "-", "-", "0", "-", "1.00x", "1.00x"))
            continue
        table.append((
            r["domain"], draft, str(r["prompts"]), f"{r['alpha']:.3f}", f"{r['mean_acceptance_length']:.2f}",
            f"{r['c']:.3f}", str(r["best_k"]), f"{r['break_even_alpha']:.3f}",
            f"{r['expected_speedup']:.2f}x", f"{r['simulated_speedup']:.2f}x",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    lines.append("")
    lines.append("acceptance per position (k = k_max; position p counted when positions < p were accepted):")
    for r in rows:
        if "curve" in r:
            lines.append(f"  {r['domain']:<12} " + " ".join(_fmt(v) for v in r["per_position"])
                         + f"   draft step {r['draft_step_ms']:.3f} ms")
    lines.append("")
    lines.append("expected speedup by k (simulated in brackets):")
    for r in rows:
        if "curve" in r:
            lines.append(f"  {r['domain']:<12} " + "  ".join(
                f"k={p['k']}: {p['expected_speedup']:.2f} ({p['simulated_speedup']:.2f})" for p in r["curve"]))
    return "\n".join(lines)
