"""What the proposer remembers of each request between steps, and how a step's rows find it.

A framework's rows carry no request id (vLLM's proposer interface) and may move
between steps. A request's row grows by exactly the tokens sampled for it since
the last step, so a row with ``n`` tokens of which ``s`` were sampled now belongs
to the state whose context is the row's first ``n - s`` tokens. Comparing whole
contexts would make every step cost the context length; instead each state is
filed under a **key** of its context, computed from at most
:data:`KEY_TOKENS` of its tokens, and a row is looked up under the key of its
first ``n - s`` tokens (:func:`row_keys`, one gather for the whole batch):

    key = (length, the tokens at 48 positions: the first 16, 16 spread evenly
           over the context, the last 16)

so a step reads, per row, those 48 tokens and the ``s`` new ones, whatever the
context length. The row that held a state at the last step is tried first (its
key must still match); a row that moved finds its state in the key's bucket. When
several unclaimed states share the key (identical prompts, or prompts that agree
at every sampled position), their whole contexts are compared with the row's:
the one exception to constant work, paid only by a row that moved into such a
bucket. Two requests with equal keys and different tokens elsewhere that
exchange rows between steps (the row-first check sees equal keys) would exchange
states: their drafts would then continue the other's context, which costs
acceptance but never correctness (the target verifies every draft).

An adapter that knows request ids (TGI) passes them instead, and a state is then
found by its id: no key at all (:class:`StateIndex` keeps both).

A state's tokens live in a buffer that grows by doubling, so moving a context on
by ``s`` tokens copies ``s`` tokens (amortised), and the draft engine gets a view
of the context, not a copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .draft_engine import DraftCache
    from .lookup import NgramIndex, Shadow

__all__ = ["KEY_TOKENS", "RequestState", "StateIndex", "row_keys"]

_HEAD, _SPREAD, _TAIL = 16, 16, 16
#: tokens of a context its key reads
KEY_TOKENS = _HEAD + _SPREAD + _TAIL

#: (length, the key tokens' bytes); length 0 only for rows that hold no request
Key = tuple[int, bytes]


#: key position j of a context of n tokens: n * _SCALE[j] // (_SPREAD + 1) + _SHIFT[j]
_SCALE = np.concatenate([np.zeros(_HEAD), np.arange(1, _SPREAD + 1), np.full(_TAIL, _SPREAD + 1)]).astype(np.int64)
_SHIFT = np.concatenate([np.arange(_HEAD), np.zeros(_SPREAD), np.arange(-_TAIL, 0)]).astype(np.int64)


def row_keys(token_ids, rows: np.ndarray, lengths: np.ndarray) -> list[Key]:
    """The key of ``token_ids[rows[j], :lengths[j]]`` for every ``j``, in one gather.

    ``token_ids`` is a 2-D integer array; only the :data:`KEY_TOKENS` positions of
    each row's key are read (fewer distinct ones for a context shorter than that).
    """
    rows = np.asarray(rows, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(rows) == 0:
        return []
    n = lengths[:, None]
    positions = n * _SCALE // (_SPREAD + 1) + _SHIFT  # head, spread, tail
    np.minimum(positions, n - 1, out=positions)
    np.maximum(positions, 0, out=positions)
    values = np.asarray(token_ids[rows[:, None], positions]).astype(np.int64, copy=False)
    return [(length, values[j].tobytes()) for j, length in enumerate(lengths.tolist())]


@dataclass(eq=False)  # states are compared (and hashed) by identity
class RequestState:
    """What the proposer remembers of one request between steps."""

    domain: str
    buffer: np.ndarray  #: int64; the verified tokens are ``buffer[:length]``
    length: int
    cache: DraftCache | None = None
    last_drafts: tuple[int, ...] = ()
    row: int = -1  #: batch row at the last step
    key: Key | None = None  #: the context's key (rows without request ids)
    request_id: Hashable | None = None  #: the adapter's id (rows with request ids)
    lookup: NgramIndex | None = None  #: the n-gram index of its context (domains with prompt lookup)
    drafter: str | None = None  #: the controller entry that made ``last_drafts`` (None: its domain)
    offer: int | None = None  #: the most a lookup would have drafted at any k (``spec_factor``'s cap; None: k)
    shadows: list[Shadow] = field(default_factory=list)  #: capped lookup drafts followed to their end
    free_from: int = 0  #: where the uncapped lookup policy's next step would be (``Shadow.free``)

    @classmethod
    def start(cls, domain: str, tokens: np.ndarray, **fields) -> RequestState:
        """A state holding a copy of ``tokens`` (room to grow: twice as much)."""
        buffer = np.empty(max(16, 2 * len(tokens)), dtype=np.int64)
        buffer[: len(tokens)] = tokens
        return cls(domain=domain, buffer=buffer, length=len(tokens), **fields)

    @property
    def context(self) -> np.ndarray:
        """The verified tokens at the last step: a read-only view, valid until the next step."""
        view = self.buffer[: self.length]
        view.flags.writeable = False
        return view

    def extend(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` (copies them; the buffer doubles when full)."""
        end = self.length + len(tokens)
        if end > len(self.buffer):
            grown = np.empty(max(end, 2 * len(self.buffer)), dtype=np.int64)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        self.buffer[self.length: end] = tokens
        self.length = end


class StateIndex:
    """The live states, findable by last row, by key and by request id."""

    def __init__(self) -> None:
        self.states: set[RequestState] = set()
        self.by_row: dict[int, RequestState] = {}
        self.by_key: dict[Key, list[RequestState]] = {}
        self.by_request: dict[Hashable, RequestState] = {}

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self):
        return iter(list(self.states))

    def add(self, state: RequestState) -> None:
        self.states.add(state)

    def find(self, row: int, key: Key, tokens, claimed: set[RequestState]) -> RequestState | None:
        """The unclaimed state whose context is the first ``key[0]`` tokens of row
        ``row`` (read from ``tokens``, the 2-D token array, only to tell apart states
        with equal keys), or ``None``.

        The key holds the row's known length: a request's row grows by exactly the
        tokens sampled for it since the last step. That keeps a new request whose
        prompt extends a finished one's tokens (the next turn of a chat) from
        inheriting its state and domain."""
        state = self.by_row.get(row)
        if state is not None and state not in claimed and state.key == key:
            return state
        candidates = [s for s in self.by_key.get(key, ()) if s not in claimed]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        row_tokens = np.asarray(tokens[row, : key[0]])
        return next((s for s in candidates if np.array_equal(s.context, row_tokens)), None)

    def find_request(self, request_id: Hashable, length: int, claimed: set[RequestState]) -> RequestState | None:
        """The unclaimed state of ``request_id`` if its context has ``length`` tokens
        (another length: the id came back for a new request), or ``None``."""
        state = self.by_request.get(request_id)
        if state is not None and state not in claimed and state.length == length:
            return state
        return None

    def keep_only(self, claimed: Iterable[RequestState]) -> list[RequestState]:
        """Keep the ``claimed`` states, re-indexed by their row, key and id; return the others."""
        claimed = set(claimed)
        dropped = [s for s in self.states if s not in claimed]
        self.states = claimed
        self.by_row = {s.row: s for s in claimed}
        self.by_key = {}
        for s in claimed:
            if s.key is not None:
                self.by_key.setdefault(s.key, []).append(s)
        self.by_request = {s.request_id: s for s in claimed if s.request_id is not None}
        return dropped
