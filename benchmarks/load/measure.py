"""One server under the load: warm up, settle, read memory, run the rounds, compare with stock."""

from __future__ import annotations

import re
import time

from accel_plugin.testing.vllm_server import healthy

from .clients import Outcome, run_load, stream_one
from .results import ServerResult, percentile, wrong_tokens
from .servers import attention_backend, draft_kv_bytes, engine_rss, wait_idle
from .workload import LoadRequest

_LOG_ERRORS = re.compile(r"^(?:.*\bERROR\b.*|Traceback .*)$", re.MULTILINE)


def measure(label: str, base: str, pid: int, model: str, requests: list[LoadRequest], clients: int,
            log_text, reference: list[Outcome] | None = None, rounds: int = 1) -> tuple[ServerResult, list[Outcome]]:
    """Warm up, settle, read memory; then ``rounds`` times: run the load, settle, read
    memory again. Returns the result and the first round's outcomes (the reference of
    another server; every round is compared with ``reference``).

    ``log_text()`` returns the server's log so far (its ERROR lines during the load are reported).
    """
    settle = LoadRequest(-1, "settle", "Hi", 2, None)
    warm = [r for r in requests if r.cancel_after is None][:4]
    run_load(base, model, warm, len(warm))
    stream_one(base, model, settle)
    wait_idle(base)
    rss_before, kv_before = engine_rss(pid), draft_kv_bytes(base)
    log_start = len(log_text())
    per_round, wall, rss_rounds, kv_after = [], 0.0, [], None
    for _ in range(rounds):
        outcomes, seconds = run_load(base, model, requests, clients)
        wait_idle(base)
        stream_one(base, model, settle)
        wait_idle(base)
        time.sleep(1.0)
        per_round.append(outcomes)
        wall += seconds
        rss_rounds.append(engine_rss(pid))
        kv_after = draft_kv_bytes(base)
    log = log_text()
    outcomes = [o for round_outcomes in per_round for o in round_outcomes]
    latencies = [o.seconds for o in outcomes if o.status == "completed"]
    errors = [o for o in outcomes if o.status == "error"]
    result = ServerResult(
        server=label, backend=attention_backend(base, log), requests=len(outcomes),
        completed=sum(o.status == "completed" for o in outcomes),
        cancelled=sum(o.status == "cancelled" for o in outcomes), errors=len(errors),
        wrong_tokens=None if reference is None else sum(wrong_tokens(r, reference) for r in per_round),
        p50_s=percentile(latencies, 0.5), p99_s=percentile(latencies, 0.99),
        tokens_per_s=sum(len(o.token_ids) for o in outcomes) / wall,
        rss_before=rss_before, rss_after=rss_rounds[-1], draft_kv_before=kv_before, draft_kv_after=kv_after,
        rss_rounds=rss_rounds, healthy_after=healthy(base), log_errors=_LOG_ERRORS.findall(log[log_start:])[:5],
        error_samples=[f"#{o.index}: {o.error}" for o in errors[:5]],
    )
    return result, per_round[0]
