"""The load test's results: one server's counts, latencies and memory, compared with stock, and the table."""

from __future__ import annotations

from dataclasses import dataclass

from .clients import Outcome


@dataclass
class ServerResult:
    server: str
    backend: str
    requests: int
    completed: int
    cancelled: int
    errors: int
    wrong_tokens: int | None  #: against stock (None: this is stock)
    p50_s: float | None
    p99_s: float | None
    tokens_per_s: float
    rss_before: int
    rss_after: int  #: after the last round
    draft_kv_before: int | None
    draft_kv_after: int | None
    #: RSS after each round of the load (the last one is ``rss_after``)
    rss_rounds: list[int]
    healthy_after: bool
    log_errors: list[str]
    error_samples: list[str]

    @property
    def rss_ratio(self) -> float:
        return self.rss_after / self.rss_before if self.rss_before else float("nan")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def wrong_tokens(outcomes: list[Outcome], reference: list[Outcome]) -> int:
    """Positions where a completed output differs from the reference (lengths included);
    a cancelled one counts where it differs from the reference's prefix."""
    wrong = 0
    for got, ref in zip(outcomes, reference):
        if got.status == "completed" and ref.status == "completed":
            wrong += sum(a != b for a, b in zip(got.token_ids, ref.token_ids))
            wrong += abs(len(got.token_ids) - len(ref.token_ids))
        elif got.status != "error" and ref.status != "error":
            n = min(len(got.token_ids), len(ref.token_ids))
            wrong += sum(a != b for a, b in zip(got.token_ids[:n], ref.token_ids[:n]))
    return wrong


def table(results: list[ServerResult]) -> str:
    def mib(n):
        return "-" if n is None else f"{n / 2**20:,.0f}"

    def sec(s):
        return "-" if s is None else f"{s:.2f}"

    head = ("server", "backend", "requests", "completed", "cancelled", "errors", "wrong tokens", "p50 s", "p99 s",
            "tokens/s", "RSS before MiB", "RSS after each round MiB", "after/before", "draft KV before MiB",
            "draft KV after MiB")
    rows = [head] + [(
        r.server, r.backend, str(r.requests), str(r.completed), str(r.cancelled), str(r.errors),
        "-" if r.wrong_tokens is None else str(r.wrong_tokens), sec(r.p50_s), sec(r.p99_s), f"{r.tokens_per_s:.1f}",
        mib(r.rss_before), " / ".join(map(mib, r.rss_rounds)), f"{r.rss_ratio:.3f}", mib(r.draft_kv_before),
        mib(r.draft_kv_after),
    ) for r in results]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(head))
    return "\n".join(lines)
