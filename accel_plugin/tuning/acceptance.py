"""Greedy acceptance of a draft against a target, step costs, and the speedup model.

Acceptance (greedy decoding, exact): for a prompt, the target's greedy continuation
``y_1..y_N`` is what any speculative run outputs. In a round that starts after
``y_<j``, the draft proposes ``k`` greedy tokens; the target accepts the longest
prefix equal to ``y_j..``, then adds one token of its own. The ``i``-th drafted
token is only looked at when the earlier ones were accepted, and then the draft's
context is exactly the target's text ``prompt + y_<j+i``. So one teacher-forced
draft forward over ``prompt + y`` gives every answer: ``match[i]`` = (draft's
argmax after ``prompt + y_<i``) == ``y_i``, and :func:`simulate` replays the rounds
for any ``k`` from these flags.

Reported, as vLLM reports them: per position ``p`` the acceptance rate given that
positions ``< p`` were accepted; overall ``alpha`` = accepted / tested positions
(a round of ``k`` drafts with ``n`` accepted tests ``n + (n < k)`` positions, the
estimate the controller uses); mean acceptance length = tokens per target step =
1 + accepted / rounds.

Costs: ``c`` = one draft forward step / one target forward step, both measured with
the draft engine's lean Llama forward (``accel_plugin.speculative.llama``: 1 new
token, preallocated KV cache, batch 1), so it is a ratio of the same code path. The
serving framework's target step is usually slower than the lean forward (vLLM's
scheduler, sampler ...); pass ``target_step_ms`` measured there for its ``c``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..speculative.speedup import best_k, expected_speedup, expected_tokens

__all__ = [
    "AcceptanceStats",
    "break_even_alpha",
    "greedy_continuation",
    "greedy_continuations",
    "match_flags",
    "measure_step_ms",
    "simulate",
    "simulated_speedup",
    "best_k",
    "expected_speedup",
    "expected_tokens",
]


@dataclass
class AcceptanceStats:
    """Counts of one simulated speculative run (any number of prompts) at fixed ``k``."""

    k: int
    accepted_per_pos: list[int] = field(default_factory=list)
    tested_per_pos: list[int] = field(default_factory=list)
    rounds: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.k
        self.tested_per_pos = self.tested_per_pos or [0] * self.k

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_pos)

    @property
    def alpha(self) -> float:
        """accepted / tested positions (0.0 when nothing was tested)."""
        tested = sum(self.tested_per_pos)
        return self.accepted / tested if tested else 0.0

    @property
    def per_position(self) -> list[float | None]:
        return [a / t if t else None for a, t in zip(self.accepted_per_pos, self.tested_per_pos)]

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target step, 1 + accepted / rounds (vLLM's metric of the same name)."""
        return self.tokens / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(alpha=self.alpha, per_position=self.per_position,
                   mean_acceptance_length=self.mean_acceptance_length)
        return out


def simulate(flags: list[list[bool]], k: int) -> AcceptanceStats:
    """Replay greedy speculative rounds with ``k`` drafts on per-token match flags.

    ``flags[p][i]``: the draft predicts the target's ``i``-th continuation token of
    prompt ``p`` when given the target's text before it. Each round accepts the
    longest run of matches (at most ``k``) and adds the target's own token.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    stats = AcceptanceStats(k)
    for match in flags:
        n, j = len(match), 0
        while j < n:
            m = 0
            while m < k and j + m < n - 1 and match[j + m]:
                # the last token is never drafted-and-accepted: a round always ends
                # with the target's own token, so the run stops one short of the end
                stats.accepted_per_pos[m] += 1
                stats.tested_per_pos[m] += 1
                m += 1
            if m < k and j + m < n - 1:
                stats.tested_per_pos[m] += 1  # position m was drafted and rejected
            stats.rounds += 1
            stats.tokens += m + 1
            j += m + 1
    return stats


def break_even_alpha(k: int, c: float) -> float:
    """The acceptance at which drafting ``k`` tokens neither gains nor loses (S = 1).

    1.0 when even perfect acceptance does not pay (k + 1 <= k c + 1).
    """
    if expected_speedup(1.0, k, c) <= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_speedup(mid, k, c) < 1.0:
            lo = mid
        else:
            hi = mid
    return hi


def simulated_speedup(stats: AcceptanceStats, draft_ms: float, target_ms: float) -> float:
    """Plain time / speculative time, from simulated rounds and measured step times.

    Plain: one target step per token. Speculative: per round ``k`` draft steps and one
    target verify step (costed as one target step). A simulation, not a measurement
    of a serving framework; ``accel demo`` measures that.
    """
    if not stats.rounds:
        return 1.0
    plain = stats.tokens * target_ms
    spec = stats.rounds * (stats.k * draft_ms + target_ms)
    return plain / spec


# ------------------------------------------------------------------ models


def _no_grad():
    import torch

    return torch.inference_mode()


def greedy_continuation(model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """The model's greedy continuation of ``prompt_ids`` (EOS does not stop it)."""
    import torch

    with _no_grad():
        out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        tokens = []
        for _ in range(num_tokens):
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
            if len(tokens) == num_tokens:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def greedy_continuations(model, prompts_ids: list[list[int]], num_tokens: int, *, batch_size: int = 16,
                         stop_ids: frozenset[int] = frozenset(), progress=None) -> list[list[int]]:
    """:func:`greedy_continuation` of many prompts, ``batch_size`` at a time
    (left-padded, with the attention mask and positions of each row). A
    continuation ends after the first token in ``stop_ids`` (kept), if any."""
    import torch

    out: list[list[int]] = []
    for start in range(0, len(prompts_ids), batch_size):
        group = prompts_ids[start:start + batch_size]
        width = max(len(ids) for ids in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for r, row in enumerate(group):
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.zeros(len(group), num_tokens, dtype=torch.long)
        with _no_grad():
            result = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            for i in range(num_tokens):
                nxt = result.logits[:, -1].argmax(-1)
                tokens[:, i] = nxt
                if i + 1 == num_tokens:
                    break
                mask = torch.cat([mask, torch.ones(len(group), 1, dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
                result = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                               past_key_values=result.past_key_values, use_cache=True)
        for row in tokens.tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
            out.append(row[:end])
        if progress:
            progress(len(group))
    return out


def match_flags(draft, prompt_ids: list[int], continuation: list[int]) -> list[bool]:
    """``flags[i]``: the draft's argmax after ``prompt + continuation[:i]`` is ``continuation[i]``
    (through the draft's ``head_vocab`` when its head is pruned)."""
    import torch

    ids = torch.tensor([prompt_ids + continuation])
    with _no_grad():
        logits = draft(input_ids=ids).logits[0]
    start = len(prompt_ids) - 1
    predicted = logits[start:start + len(continuation)].argmax(-1)
    head_vocab = getattr(draft, "head_vocab", None)
    if head_vocab is not None:
        predicted = head_vocab[predicted]
    return [p == t for p, t in zip(predicted.tolist(), continuation)]


def measure_step_ms(model_dirs, *, context: int = 64, rounds: int = 8, steps: int = 10,
                    warmup: int = 5, target_dir=None) -> dict[str, float]:
    """Milliseconds of one decode step (1 token, KV cache, batch 1, lean forward) per model dir.

    The models take turns (``rounds`` x ``steps`` timed steps each, after ``warmup``)
    so that load from other processes hits them alike, and the 20th percentile is
    kept: on a shared machine the low part of the distribution is the model, the
    high part the neighbours.
    """
    import torch

    from ..speculative.llama import LlamaDraftModel

    total = context + warmup + rounds * steps + 2
    states = {}
    for d in dict.fromkeys(str(m) for m in model_dirs):
        model = LlamaDraftModel(d, dtype=torch.float32, max_len=total, initial_slots=1, target_dir=target_dir)
        slot = torch.tensor([model.alloc_slot()])
        tokens = torch.randint(0, model.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
        model.forward(tokens, torch.tensor([0]), torch.tensor([context]), slot)
        states[d] = {"model": model, "slot": slot, "pos": context, "next": torch.tensor([[1]]), "times": []}

    def step(st, timed: bool) -> None:
        t0 = time.perf_counter()
        logits = st["model"].forward(st["next"], torch.tensor([st["pos"]]), torch.tensor([1]), st["slot"])
        st["next"] = st["model"].greedy(logits)[:, None]
        if timed:
            st["times"].append(time.perf_counter() - t0)
        st["pos"] += 1

    for st in states.values():
        for _ in range(warmup):
            step(st, False)
    for _ in range(rounds):
        for st in states.values():
            for _ in range(steps):
                step(st, True)
    return {d: sorted(st["times"])[len(st["times"]) // 5] * 1e3 for d, st in states.items()}
