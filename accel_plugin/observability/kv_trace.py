"""Request traces for the KV-cache simulator: a JSONL trace read and checked, or a seeded
ShareGPT-like synthetic one (``accel kv simulate --trace`` and its default; docs/observability.md).

A request's ``arrival`` is a step of the simulator's time model
(:mod:`accel_plugin.observability.kv_simulator`). Framework-free: neither torch nor a
serving framework is imported.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Hashable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["SYNTHETIC", "Request", "TraceError", "check_requests", "load_trace", "synthetic_trace"]

#: Parameters of :func:`synthetic_trace`: a parametric approximation of ShareGPT's
#: shape (no dataset is downloaded): log-normal lengths whose means (about 165 prompt,
#: 330 output tokens before clipping) are near the ShareGPT means the vLLM paper
#: reports (about 161 and 338), long right tails; Poisson arrivals; a share of
#: requests start with one of a few system prompts (ShareGPT itself has none).
SYNTHETIC = {
    "prompt_median": 100, "prompt_sigma": 1.0,
    "output_median": 200, "output_sigma": 1.0,
    "system_prompt_share": 0.5, "system_prompt_lens": (50, 100, 200, 400),
}


class TraceError(ValueError):
    """A bad trace: the message names the file, the line and the field."""


class Request(BaseModel):
    """One request of a trace (one JSONL line). ``arrival`` is a step number (steps: :mod:`.kv_simulator`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    arrival: int = Field(ge=0)
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    #: requests with the same prefix_id start with the same prefix_len tokens
    prefix_id: str | int | None = None
    prefix_len: int | None = Field(default=None, ge=1)
    #: the request's max_tokens: contiguous allocation reserves prompt_len + max_output_len
    max_output_len: int | None = Field(default=None, ge=1)
    id: str | int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Request:
        if (self.prefix_id is None) != (self.prefix_len is None):
            raise ValueError("prefix_id and prefix_len go together: give both or neither")
        if self.prefix_len is not None and self.prefix_len > self.prompt_len:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be <= prompt_len ({self.prompt_len})")
        if self.max_output_len is not None and self.max_output_len < self.output_len:
            raise ValueError(f"max_output_len ({self.max_output_len}) must be >= output_len ({self.output_len})")
        return self

    @property
    def final_len(self) -> int:
        """Its length at its last step: prompt_len + output_len - 1 (the last sampled token is never fed)."""
        return self.prompt_len + self.output_len - 1


def check_requests(requests: Sequence[Request], max_model_len: int, labels: Sequence[str] | None = None) -> None:
    """Raise :class:`TraceError` unless every request fits ``max_model_len`` and each
    ``prefix_id`` has one ``prefix_len``; ``labels`` name the requests (default ``request N``)."""
    first_len: dict[Hashable, tuple[int, str]] = {}
    for i, req in enumerate(requests):
        label = labels[i] if labels else f"request {i}"
        if req.prompt_len + req.output_len > max_model_len:
            raise TraceError(f"{label}: prompt_len + output_len = {req.prompt_len + req.output_len} "
                             f"exceeds --max-model-len {max_model_len}")
        if req.prefix_id is not None:
            known = first_len.setdefault(req.prefix_id, (req.prefix_len, label))
            if known[0] != req.prefix_len:
                raise TraceError(f"{label}: prefix_len: prefix_id {req.prefix_id!r} has prefix_len {known[0]} "
                                 f"at {known[1]}; got {req.prefix_len}")


def load_trace(path: str | Path, max_model_len: int) -> list[Request]:
    """Read a JSONL trace (one :class:`Request` per line, blank lines skipped).

    Raises :class:`TraceError` naming the file, the line and the field of the first problem.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"--trace: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    requests, labels = [], []
    valid = ", ".join(Request.model_fields)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise TraceError(f"{where}: expected a JSON object with {valid}; got {type(data).__name__}")
        try:
            requests.append(Request.model_validate(data))
        except ValidationError as exc:
            raise TraceError(f"{where}: {_problems(exc, valid)}") from None
        labels.append(where)
    if not requests:
        raise TraceError(f"{path}: no requests (expected JSONL lines with {valid})")
    check_requests(requests, max_model_len, labels)
    return requests


def _problems(exc: ValidationError, valid: str) -> str:
    """One line: each field's problem, unknown fields first (a typo explains a missing field)."""
    problems = []
    for err in sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden"):
        name = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown field (valid fields: {valid})"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["loc"]:
            message += f", got {err['input']!r}"
        problems.append(f"{name}: {message}" if name else message)
    return "; ".join(problems)


def synthetic_trace(requests: int = 1000, seed: int = 0, max_model_len: int = 2048,
                    arrival_rate: float = 1.0) -> list[Request]:
    """A seeded ShareGPT-like trace (parameters and their source: :data:`SYNTHETIC`).

    Arrivals: Poisson, ``arrival_rate`` requests per step. A request with a system
    prompt has ``prompt_len = system prompt + user prompt``; lengths are clipped so
    that ``prompt_len + output_len <= max_model_len``.
    """
    if requests < 1 or max_model_len < 2 or not 0 < arrival_rate < math.inf:
        raise ValueError("need requests >= 1, max_model_len >= 2, 0 < arrival_rate < inf; "
                         f"got {requests}, {max_model_len}, {arrival_rate}")
    rng, p = random.Random(seed), SYNTHETIC
    out, clock = [], 0.0
    for _ in range(requests):
        arrival = int(clock)
        clock += rng.expovariate(arrival_rate)
        user = max(1, round(rng.lognormvariate(math.log(p["prompt_median"]), p["prompt_sigma"])))
        output = max(1, round(rng.lognormvariate(math.log(p["output_median"]), p["output_sigma"])))
        system = rng.random() < p["system_prompt_share"]
        which = rng.randrange(len(p["system_prompt_lens"]))
        prefix_len = p["system_prompt_lens"][which] if system else 0
        if prefix_len + 2 > max_model_len:
            prefix_len = 0
        prompt = min(prefix_len + user, max_model_len - 1)
        output = min(output, max_model_len - prompt)
        out.append(Request(arrival=arrival, prompt_len=prompt, output_len=output,
                           prefix_id=f"system-{which}" if prefix_len else None, prefix_len=prefix_len or None))
    return out
