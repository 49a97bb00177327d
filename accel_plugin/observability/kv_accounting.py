"""KV-cache memory accounting: the token slots a set of sequences uses, holds and wastes.

Shared by ``accel kv simulate`` (:mod:`accel_plugin.observability.kv_simulator`) and the
live metrics (:mod:`accel_plugin.observability.metrics_recorders`), so a live server and
the simulator count the same way (docs/observability.md). Framework-free: neither
torch nor a serving framework is imported.

Terms (as in the PagedAttention paper, Kwon et al., SOSP 2023, section 3 and Fig. 2),
all counted in token slots (one slot holds one token's K and V in every layer):

* **used**: slots holding a stored token: the prompt and the generated tokens whose
  K/V have been written. A sequence's length ``seq_len`` is its used slots; shared
  prefix blocks are counted once.
* **allocated**: slots handed to sequences (whole blocks for paged allocation, the
  whole reservation for contiguous allocation).
* **internal** fragmentation: allocated slots no token of the sequence will ever
  fill. Paged: the unused tail of each sequence's last block (``< block_size`` per
  sequence). Contiguous: the reservation beyond the sequence's final length.
* **reserved**: allocated slots that later tokens of the same sequence will fill,
  held before they are needed. Contiguous allocation reserves the whole maximum
  length up front; paged allocation reserves nothing (a block is allocated when the
  first token that needs it is written), so paged ``reserved`` is 0.
* **external** fragmentation: free slots that no waiting request can use because
  they are not contiguous: counted, at a step, as all free slots when the first
  waiting request needs no more slots than are free but no single hole holds it
  (first-fit contiguous allocation). Paged allocation has none by construction:
  any free block serves any sequence.
* **held** = allocated + external; **waste** = held - used = internal + reserved +
  external. For paged allocation waste / held = (allocated - used) / allocated.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields

__all__ = ["Usage", "contiguous_usage", "paged_usage"]


@dataclass(frozen=True)
class Usage:
    """KV-cache memory of a set of sequences, in token slots (terms: module docstring).

    ``blocks``: paged blocks allocated (shared blocks once); contiguous: chunks.
    Usages add up (``a + b``), so a replay's totals are the sum over its steps.
    """

    seqs: int
    used: int
    allocated: int
    blocks: int
    internal: int
    reserved: int = 0
    external: int = 0

    @property
    def held(self) -> int:
        """Slots not available to new requests: allocated + external."""
        return self.allocated + self.external

    @property
    def waste(self) -> int:
        """held - used = internal + reserved + external."""
        return self.held - self.used

    def percent(self, part: str) -> float:
        """``part`` (internal, reserved, external, waste, used) as % of held; 0 when nothing is held."""
        return 100.0 * getattr(self, part) / self.held if self.held else 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


ZERO = Usage(0, 0, 0, 0, 0)


def paged_usage(seq_lens: Sequence[int], block_size: int,
                prefixes: Sequence[tuple[Hashable, int] | None] | None = None) -> Usage:
    """Memory of sequences of lengths ``seq_lens`` in a paged cache of ``block_size`` slots per block.

    Each sequence holds ``ceil(seq_len / block_size)`` blocks. With ``prefixes``
    (one ``(prefix_id, prefix_len)`` or ``None`` per sequence), sequences with the same
    ``prefix_id`` hold the ``prefix_len // block_size`` full blocks of their common
    prefix once. ``internal`` = allocated - used (the unused tails of last blocks);
    ``reserved`` and ``external`` are 0. Pure: the same numbers a live paged cache
    with these sequences would show.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1; got {block_size!r}")
    if prefixes is not None and len(prefixes) != len(seq_lens):
        raise ValueError(f"prefixes must have one entry per sequence: {len(prefixes)} for {len(seq_lens)}")
    blocks = used = 0
    groups: dict[Hashable, tuple[int, int]] = {}  # prefix_id -> (prefix_len, sequences)
    for i, seq_len in enumerate(seq_lens):
        if seq_len < 0:
            raise ValueError(f"seq_lens must be >= 0; got {seq_len} at index {i}")
        blocks += -(-seq_len // block_size)
        used += seq_len
        prefix = prefixes[i] if prefixes is not None else None
        if prefix is not None:
            prefix_id, prefix_len = prefix
            if not 0 <= prefix_len <= seq_len:
                raise ValueError(f"prefix_len must be in 0..seq_len ({seq_len}); got {prefix_len} at index {i}")
            known_len, count = groups.get(prefix_id, (prefix_len, 0))
            if known_len != prefix_len:
                raise ValueError(f"prefix {prefix_id!r} has prefix_len {known_len} and {prefix_len}")
            groups[prefix_id] = (prefix_len, count + 1)
    for prefix_len, count in groups.values():
        shared_blocks = (count - 1) * (prefix_len // block_size)
        blocks -= shared_blocks
        used -= shared_blocks * block_size
    allocated = blocks * block_size
    return Usage(len(seq_lens), used, allocated, blocks, allocated - used)


def contiguous_usage(seq_lens: Sequence[int], reservations: Sequence[int], final_lens: Sequence[int]) -> Usage:
    """Memory of sequences each holding one contiguous chunk of ``reservations[i]`` slots.

    ``final_lens[i]``: the length sequence i will reach. ``reserved`` = final - current
    (slots later tokens will fill), ``internal`` = reservation - final (never filled).
    ``external`` depends on the chunks' layout and is 0 here (see :class:`ContiguousAllocator`).
    """
    if not len(seq_lens) == len(reservations) == len(final_lens):
        raise ValueError("seq_lens, reservations and final_lens must have the same length")
    for i, (cur, res, final) in enumerate(zip(seq_lens, reservations, final_lens)):
        if not 0 <= cur <= final <= res:
            raise ValueError(f"need 0 <= seq_len <= final_len <= reservation; got {cur}, {final}, {res} at index {i}")
    used, allocated, final = sum(seq_lens), sum(reservations), sum(final_lens)
    return Usage(len(seq_lens), used, allocated, len(seq_lens), allocated - final, final - used)
