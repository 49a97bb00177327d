"""The acceptance of one domain's drafts: a window of the last observations (one per
request and step: drafted ``k``, accepted ``n``) with running sums, giving the
per-position acceptance ``a`` as accepted / tested positions (a position is tested
when every earlier draft was accepted: ``n + (n < k)`` positions, the
maximum-likelihood estimate, unlike accepted / drafted which is biased low)."""

from __future__ import annotations

from collections import deque

__all__ = ["AcceptanceWindow"]


class AcceptanceWindow:
    """The last ``size`` observations ``(k drafted, n accepted)``, with running sums."""

    def __init__(self, size: int, k_max: int):
        self.size = size
        self._obs: deque[tuple[int, int]] = deque()
        self.tested = 0
        self.accepted = 0
        self.drafted = 0
        # per position j (0-based): how often it was tested / accepted
        self.pos_tested = [0] * k_max
        self.pos_accepted = [0] * k_max

    def __len__(self) -> int:
        return len(self._obs)

    def _apply(self, k: int, n: int, sign: int) -> None:
        tested = min(n + 1, k)
        self.tested += sign * tested
        self.accepted += sign * n
        self.drafted += sign * k
        for j in range(min(tested, len(self.pos_tested))):
            self.pos_tested[j] += sign
            if j < n:
                self.pos_accepted[j] += sign

    def add(self, k: int, n: int) -> None:
        if k <= 0:
            return
        if not 0 <= n <= k:
            raise ValueError(f"accepted must be in 0..{k}; got {n}")
        self._obs.append((k, n))
        self._apply(k, n, +1)
        if len(self._obs) > self.size:
            self._apply(*self._obs.popleft(), -1)

    @property
    def alpha(self) -> float | None:
        """Per-position acceptance (accepted / tested positions); ``None`` without data."""
        return self.accepted / self.tested if self.tested else None

    def per_position(self) -> list[float | None]:
        """Conditional acceptance at each draft position (given all earlier accepted)."""
        return [a / t if t else None for a, t in zip(self.pos_accepted, self.pos_tested)]

    def positions(self, weight: float = 16.0) -> list[float] | None:
        """Conditional acceptance per position for the speedup model (``None`` without data):
        each position's accepted / tested, shrunk towards the position before it (the first
        towards :attr:`alpha`) by ``weight`` pseudo-tests, so that a position tested rarely,
        or no longer (k was lowered), reads like the one before it."""
        if not self.tested:
            return None
        out, prior = [], self.accepted / self.tested
        for a, t in zip(self.pos_accepted, self.pos_tested):
            prior = (a + weight * prior) / (t + weight)
            out.append(prior)
        return out
