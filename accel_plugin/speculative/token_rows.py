"""Some tokens of some rows: what an adapter that knows request ids hands ``propose``.

:meth:`~accel_plugin.speculative.proposer.DomainProposer.propose` reads a row's
tokens as ``token_ids[i, start:stop]``. vLLM passes its whole host token array
(``token_ids_cpu``, already on the host); an adapter whose tokens live on the
device (TGI's ``all_input_ids_tensor``) would copy every row's whole history to
the host each step to build one. With request ids the proposer reads only the
new tokens of a request it knows and the whole row of a request it does not
(``propose(..., request_ids=...)``), so such an adapter copies only those and
hands them over as :class:`TokenRows`: per row, the tokens from an offset on.
A read outside what a row holds raises :class:`IndexError` naming the range held.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["TokenRows"]


class TokenRows:
    """``rows[i] = (offset, tokens)``: row ``i``'s tokens ``offset .. offset + len(tokens)``.

    Indexed like a 2-D token array, ``token_rows[i, start:stop]`` (``start``
    defaults to 0, ``stop`` to the end of what the row holds; no step).
    """

    def __init__(self, rows: Mapping[int, tuple[int, np.ndarray]]):
        self._rows = {int(i): (int(offset), np.asarray(tokens)) for i, (offset, tokens) in rows.items()}

    def __len__(self) -> int:
        return len(self._rows)

    def held(self, row: int) -> tuple[int, int]:
        """``(start, stop)`` of the tokens row ``row`` holds."""
        offset, tokens = self._row(row)
        return offset, offset + len(tokens)

    def _row(self, row: int) -> tuple[int, np.ndarray]:
        try:
            return self._rows[row]
        except KeyError:
            raise IndexError(f"row {row} holds no tokens; rows held: {sorted(self._rows)}") from None

    def __getitem__(self, key: tuple[int, slice]) -> np.ndarray:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], slice) and key[1].step is None):
            raise TypeError(f"TokenRows is indexed as token_rows[row, start:stop]; got {key!r}")
        row, cut = int(key[0]), key[1]
        offset, tokens = self._row(row)
        start = 0 if cut.start is None else int(cut.start)
        stop = offset + len(tokens) if cut.stop is None else int(cut.stop)
        if start < offset or stop > offset + len(tokens) or start > stop:
            raise IndexError(f"row {row} holds tokens {offset}:{offset + len(tokens)}; asked for {start}:{stop}")
        return tokens[start - offset: stop - offset]
