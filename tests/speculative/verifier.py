"""A greedy verifier that drives a DomainProposer the way vLLM does, and the check of
what the proposer is responsible for. Used by test_proposer.py (loaded by path:
tests/ is not a package).

:func:`serve` plays vLLM's part: a persistent batch whose rows move when requests
finish, arrive or are left out of a step (vLLM takes unscheduled requests out of
its batch and keeps their drafts for when they are back); ``token_ids`` as a reused
buffer; prompts prefilled in one or more steps (``[]`` sampled until the last); the
target accepts the longest prefix of the drafts equal to its greedy choices and
adds its own token, all of them in the row even past ``max_tokens`` (vLLM truncates
the output afterwards), and a request that finishes is still in the propose call
of its last step.

Outputs equal plain greedy decoding whatever the drafts are: that is the verifier's
doing and checks only the harness. The proposer's part is what
:func:`check_proposer` asserts:

- every draft is the draft model's greedy continuation of the row's actual tokens,
  for the draft of the request's domain (computed here with transformers); no
  drafts for a row that did not decode; with fixed k, exactly ``k`` drafts (fewer
  only at ``max_len``) for a domain with a draft, none for one without;
- per domain, the counters ``steps``, ``drafted`` and ``accepted`` equal what the
  verifier did with every set of drafts whose proposer saw the result;
- one state per row that has decoded, none for rows gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

MAX_LEN = 256
#: a greedy choice whose top-2 logits are closer than this may differ between the
#: proposer's lean forward and transformers (they differ by rounding, < 2e-4)
TIE = 1e-3


def target_greedy(target, tokens: list[int]) -> list[int]:
    """Greedy next token after every prefix ``tokens[:j]``, j = 1..len (one forward)."""
    with torch.no_grad():
        return target(torch.tensor([tokens])).logits[0].argmax(-1).tolist()


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    domain: str = "default"  #: where the test expects the router to send it
    prefill_steps: int = 1  #: target steps its prompt takes (chunked prefill)
    generated: list[int] = field(default_factory=list)  #: every token the target gave it (its row in vLLM)
    drafts: list[int] = field(default_factory=list)  #: to be verified at its next step
    drafts_step: int = 0  #: the step after which they were proposed
    sampled: list[int] = field(default_factory=list)  #: what it received in the last step

    @property
    def output(self) -> list[int]:
        return self.generated[: self.max_tokens]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_tokens


@dataclass
class Proposal:
    """One row of one propose call: what the proposer was shown and what it returned."""

    call: int
    request: Request
    context: list[int]
    sampled: list[int]
    drafts: list[int]


@dataclass
class Verification:
    """The target verified ``drafted`` tokens of ``request`` and accepted ``accepted``."""

    request: Request
    drafted: int
    accepted: int
    seen: bool  #: the request was in the call right after the drafts were proposed


@dataclass
class Trace:
    proposals: list[Proposal] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)
    states: list[tuple[int, int]] = field(default_factory=list)  #: (proposer.num_states, rows that decoded) per call

    @property
    def drafted(self) -> int:
        return sum(v.drafted for v in self.verifications)

    @property
    def max_draft_len(self) -> int:
        return max((len(p.drafts) for p in self.proposals), default=0)


def serve(proposer, target, requests: list[Request], *, shuffle: int | None = None,
          arrivals: dict[int, list[Request]] | None = None, away: dict[int, list[Request]] | None = None,
          with_ids: bool = False) -> Trace:
    """Decode ``requests`` to completion with speculation, vLLM-style.

    ``shuffle``: seed of a new row order every step; ``arrivals``: requests joining
    at a step; ``away``: requests left out of a step (not decoded, not shown).
    ``with_ids``: TGI-style, pass request ids and a ``TokenRows`` that holds only
    the tokens since the last call of a request the proposer has seen (it was
    shown with sampled tokens in the last call) and the whole row of any other.
    """
    from accel_plugin.speculative.token_rows import TokenRows

    seen: dict[int, int] = {}  # id(request) -> its tokens at the last call (with ids)
    rng = np.random.default_rng(shuffle)
    batch = list(requests)
    token_ids = np.full((16, MAX_LEN), -7, dtype=np.int32)  # garbage outside the rows
    trace = Trace()
    step = 0
    while batch:
        step += 1
        batch += (arrivals or {}).get(step, [])
        rows = [r for r in batch if all(r is not a for a in (away or {}).get(step, []))]
        for r in rows:  # the target step: prefill, or verify the drafts
            r.sampled = []
            r.prefill_steps -= 1
            if r.prefill_steps > 0:
                continue
            greedy = target_greedy(target, r.tokens + r.drafts)[len(r.tokens) - 1:]
            accepted = 0
            while accepted < len(r.drafts) and r.drafts[accepted] == greedy[accepted]:
                accepted += 1
            if r.drafts:
                trace.verifications.append(Verification(r, len(r.drafts), accepted, r.drafts_step == step - 1))
            r.sampled = r.drafts[:accepted] + [greedy[accepted]]
            r.generated += r.sampled
            r.drafts = []
        if shuffle is not None:
            rng.shuffle(rows)
        token_ids[:] = -7
        num_tokens = np.zeros(16, dtype=np.int32)
        for i, r in enumerate(rows):
            token_ids[i, : len(r.tokens)] = r.tokens
            num_tokens[i] = len(r.tokens)
        if with_ids:
            held = {}
            for i, r in enumerate(rows):
                start = seen.get(id(r), 0)
                held[i] = (start, token_ids[i, start: len(r.tokens)].copy())
            seen = {id(r): len(r.tokens) for r in rows if r.sampled}
            drafts = proposer.propose([list(r.sampled) for r in rows], num_tokens, TokenRows(held),
                                      request_ids=[id(r) for r in rows])
        else:
            drafts = proposer.propose([list(r.sampled) for r in rows], num_tokens, token_ids)
        assert len(drafts) == len(rows)
        for r, d in zip(rows, drafts):
            trace.proposals.append(Proposal(step, r, r.tokens, list(r.sampled), list(d)))
            if r.sampled:
                r.drafts, r.drafts_step = list(d), step
        trace.states.append((proposer.num_states, sum(1 for r in rows if r.generated)))
        batch = [r for r in batch if not r.done]
    return trace


class DraftReference:
    """Greedy continuations by each domain's draft model, computed with transformers."""

    def __init__(self, drafts: dict[str, str | None]):
        self.drafts = drafts
        self._models: dict[str, torch.nn.Module] = {}

    def _model(self, domain: str):
        from transformers import LlamaForCausalLM

        path = str(self.drafts[domain])
        if path not in self._models:
            self._models[path] = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return self._models[path]

    def continuation(self, domain: str, context: list[int], n: int) -> list[tuple[int, float]]:
        """``n`` greedy tokens after ``context``, each with its top-2 logit gap."""
        model, tokens, out = self._model(domain), list(context), []
        with torch.no_grad():
            for _ in range(n):
                top = model(torch.tensor([tokens])).logits[0, -1].topk(2)
                out.append((int(top.indices[0]), float(top.values[0] - top.values[1])))
                tokens.append(out[-1][0])
        return out


def _same_greedy(drafts: list[int], reference: list[tuple[int, float]]) -> bool:
    for got, (want, gap) in zip(drafts, reference):
        if got != want:
            return gap < TIE  # a near-tie: what follows continues another text
    return True


def expected_counters(trace: Trace) -> dict[str, tuple[int, int, int]]:
    """Per domain: (steps, drafted, accepted) of the verifications the proposer saw."""
    out: dict[str, tuple[int, int, int]] = {}
    for v in trace.verifications:
        if v.seen:
            steps, drafted, accepted = out.get(v.request.domain, (0, 0, 0))
            out[v.request.domain] = (steps + 1, drafted + v.drafted, accepted + v.accepted)
    return out


def check_proposer(proposer, trace: Trace, *, fixed_k: dict[str, int] | None = None) -> None:
    """Assert what the proposer is responsible for (module docstring)."""
    reference = DraftReference(proposer.config.drafts())
    for p in trace.proposals:
        where = f"call {p.call}, request {p.request.prompt[:4]}... ({p.request.domain})"
        if not p.sampled:
            assert p.drafts == [], f"{where}: drafts {p.drafts} for a row that did not decode"
            continue
        if fixed_k is not None:
            want = min(fixed_k[p.request.domain], proposer.max_len - len(p.context))
            assert len(p.drafts) == want, f"{where}: {len(p.drafts)} drafts, expected k = {want}"
        assert len(p.drafts) <= proposer.config.num_speculative_tokens
        if p.drafts:
            ref = reference.continuation(p.request.domain, p.context, len(p.drafts))
            assert _same_greedy(p.drafts, ref), (
                f"{where}: drafts {p.drafts} are not the draft's greedy continuation "
                f"{[t for t, _ in ref]} of the row's {len(p.context)} tokens")
    stats = proposer.stats()
    expected = expected_counters(trace)
    got = {d: (s.steps, s.drafted, s.accepted) for d, s in stats.items()}
    assert got == {d: expected.get(d, (0, 0, 0)) for d in stats}, \
        f"counters (steps, drafted, accepted): proposer {got}, verifier {expected}"
    for call, (states, rows) in enumerate(trace.states, 1):
        assert states == rows, f"call {call}: {states} request states for {rows} decoding rows"


_plain: dict = {}


def plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    key = (id(target), tuple(prompt), n)
    if key not in _plain:
        _plain[key] = _plain_greedy(target, prompt, n)
    return _plain[key]


def _plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(target_greedy(target, tokens)[-1])
    return tokens[len(prompt):]


def assert_lossless(target, requests: list[Request]) -> None:
    for r in requests:
        assert r.output == plain_greedy(target, r.prompt, r.max_tokens)
