"""The load test's clients: one streaming completion read to ``[DONE]`` or cancelled, many in threads."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .workload import LoadRequest


@dataclass
class Outcome:
    index: int
    status: str  #: completed, cancelled, error
    token_ids: list[int] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""


def stream_one(base: str, model: str, request: LoadRequest, timeout: float = 600) -> Outcome:
    """Send one streaming completion; read it to ``[DONE]`` or cancel it."""
    url = urllib.parse.urlparse(base)
    body = json.dumps({"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens,
                       "temperature": 0.0, "ignore_eos": True, "stream": True, "return_token_ids": True})
    out = Outcome(request.index, "error")
    start = time.perf_counter()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            out.error = f"HTTP {response.status}: {response.read()[:300]!r}"
            return out
        chunks = 0
        while True:
            line = response.readline()
            if not line:
                out.error = f"stream ended without [DONE] after {chunks} chunks"
                return out
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.status, out.seconds = "completed", time.perf_counter() - start
                return out
            event = json.loads(data)
            if "error" in event:
                out.error = f"error event: {str(event['error'])[:300]}"
                return out
            for choice in event.get("choices", []):
                out.token_ids.extend(choice.get("token_ids") or [])
            chunks += 1
            if request.cancel_after is not None and chunks >= request.cancel_after:
                out.status, out.seconds = "cancelled", time.perf_counter() - start
                return out  # the finally closes the connection mid-stream
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        conn.close()


def run_load(base: str, model: str, requests: list[LoadRequest], clients: int) -> tuple[list[Outcome], float]:
    """All requests through ``clients`` threads (one request at a time each); (outcomes, wall s)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        outcomes = list(pool.map(lambda r: stream_one(base, model, r), requests))
    return outcomes, time.perf_counter() - start
